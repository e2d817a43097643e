package chat

import (
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

// BenchmarkBody measures the request body of the load benchmark's last
// request (17 tool schemas, system prompt, 11 messages): whole (no
// remembered conversation), and continued (the conversation's first 9
// messages and the very same tool schemas remembered from the previous
// step, as the gateway serves the agent's same_tools reference).
func BenchmarkBody(b *testing.B) {
	req := providertest.LoadRequest(b, "../../testdata/load_request.json")
	a := encodeAdapters()["openai"]
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if _, _, err := a.Body(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("continued", func(b *testing.B) {
		prev := &llmv1.GenerateRequest{Model: req.Model, System: req.System, Tools: req.Tools, Messages: req.Messages[:len(req.Messages)-2]}
		s := &slot{}
		if _, _, err := a.body(prev, s); err != nil {
			b.Fatal(err)
		}
		s.prev = s.kept
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if _, _, err := a.body(req, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// reportCPU reports the process's CPU time per iteration (cpu-ns/op) when
// the returned function runs after the loop: unlike ns/op, it does not
// count the time the benchmark waited for a core on a loaded machine.
func reportCPU(b *testing.B) func() {
	c0 := cputime.Process()
	return func() {
		b.ReportMetric(float64(cputime.Process()-c0)/float64(b.N), "cpu-ns/op")
	}
}
