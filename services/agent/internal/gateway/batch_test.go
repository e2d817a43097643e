package gateway

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// TestBatchedResponses: whatever way the gateway groups a stream's chunks
// into responses (one per response as a gateway that predates batches
// sends them, or batches of any sizes), the client yields the very same
// chunks in the same order, each once; every request asks for batches,
// with and without a session (the two encodings of the codec).
func TestBatchedResponses(t *testing.T) {
	t.Parallel()
	script := fakes.ToolCalls("let me look", fakes.Call{ID: "c1", Name: "read", Args: `{"path":"a"}`}, fakes.Call{ID: "c2", Name: "ls", Args: `{}`})
	gw := &fakes.Gateway{}
	c := dialGateway(t, fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }))
	for _, tt := range []struct {
		name    string
		batches []int
	}{
		{"one per response (a gateway that predates batches)", nil},
		{"all in one", []int{len(script)}},
		{"mixed sizes", []int{2, 1, 4, 3}},
		{"batches, then singles", []int{5}},
		{"even batches", []int{3, 3, 3, 3}},
	} {
		for _, session := range []string{"", "s-1"} {
			gw.Script(fakes.Response{Chunks: script, Batches: tt.batches})
			var got []*llmv1.StreamChunk
			for ch, err := range c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "fake", Model: "m", SessionId: session,
				Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER}}}) {
				if err != nil {
					t.Fatalf("%s (session %q): %v", tt.name, session, err)
				}
				got = append(got, ch)
			}
			if len(got) != len(script) {
				t.Fatalf("%s (session %q): %d chunks, want %d", tt.name, session, len(got), len(script))
			}
			for i := range script {
				if !proto.Equal(got[i], script[i]) {
					t.Fatalf("%s (session %q): chunk %d = %v, want %v", tt.name, session, i, got[i], script[i])
				}
			}
			reqs := gw.Requests()
			if last := reqs[len(reqs)-1]; !last.GetBatchChunks() {
				t.Errorf("%s (session %q): the request did not ask for batches", tt.name, session)
			}
			// GenerateBatches yields each response's chunks together.
			gw.Script(fakes.Response{Chunks: script, Batches: tt.batches})
			var sizes []int
			got = got[:0]
			for batch, err := range c.GenerateBatches(t.Context(), &llmv1.GenerateRequest{Provider: "fake", Model: "m", SessionId: session,
				Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER}}}) {
				if err != nil {
					t.Fatalf("%s (session %q): batches: %v", tt.name, session, err)
				}
				sizes = append(sizes, len(batch))
				got = append(got, batch...)
			}
			if want := responseSizes(tt.batches, len(script)); !slices.Equal(sizes, want) {
				t.Fatalf("%s (session %q): batches of %v, the gateway sent responses of %v", tt.name, session, sizes, want)
			}
			for i := range script {
				if !proto.Equal(got[i], script[i]) {
					t.Fatalf("%s (session %q): batched chunk %d = %v, want %v", tt.name, session, i, got[i], script[i])
				}
			}
		}
	}
}

// responseSizes is how many chunks each response of fakes.Response.Batches
// groups carries, for n chunks: the groups (cut at what is left), then one
// chunk per response.
func responseSizes(groups []int, n int) []int {
	var out []int
	for _, g := range groups {
		if g = min(g, n); g > 0 {
			out = append(out, g)
			n -= g
		}
	}
	for range n {
		out = append(out, 1)
	}
	return out
}

// TestBatchEnds: a consumer that stops inside a batch gets nothing more
// (the iterator contract); a stream that ends after a batch without its
// finish yields the batch's chunks, then STREAM_CLOSED.
func TestBatchEnds(t *testing.T) {
	t.Parallel()
	script := fakes.Text("hello")
	gw := &fakes.Gateway{}
	c := dialGateway(t, fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }))
	req := &llmv1.GenerateRequest{Provider: "fake", Model: "m", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER}}}

	gw.Script(fakes.Response{Chunks: script, Batches: []int{len(script)}})
	n := 0
	for _, err := range c.Generate(t.Context(), req) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 2 {
			break
		}
	}

	gw.Script(fakes.Response{Chunks: script[:3], Batches: []int{3}})
	var got []string
	for ch, err := range c.Generate(t.Context(), req) {
		var rf *loop.RequestFailure
		switch {
		case errors.As(err, &rf):
			got = append(got, rf.Failure.GetCode())
		case err != nil:
			t.Fatal(err)
		default:
			got = append(got, fmt.Sprintf("%T", ch.GetChunk()))
		}
	}
	want := []string{"*llmv1.StreamChunk_BlockStart", "*llmv1.StreamChunk_TextDelta", "*llmv1.StreamChunk_BlockEnd", "STREAM_CLOSED"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// BenchmarkGenerateBatched measures a model step's stream as the agent
// receives it, one gRPC message per chunk against one batch, in
// alternating pairs over loopback gRPC in this process (the fake gateway's
// sends and the client's receives both count): the load benchmark's tool
// step (text, a tool call in three argument deltas, usage, finish: 10
// chunks). It reports the median CPU per step of each, the median per-pair
// ratio, and the allocations per step of each.
func BenchmarkGenerateBatched(b *testing.B) {
	text := fakes.TextBlock(0, "Step.")
	tool := fakes.ToolBlock(1, fakes.Call{ID: "call_1", Name: "read", Args: `{"file_path"`})
	args := func(s string) *llmv1.StreamChunk {
		return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Index: 1, Id: "call_1", ArgumentsDelta: s}}}
	}
	step := append(append(text, tool[:2]...), args(`:"notes.txt"`), args(`}`), tool[2], fakes.Usage(100, 10),
		fakes.Finish(&llmv1.FinishReason{Kind: &llmv1.FinishReason_ToolCalls{ToolCalls: &llmv1.FinishToolCalls{}}}))
	var batched atomic.Bool
	gw := &fakes.Gateway{Default: func(*llmv1.GenerateRequest) fakes.Response {
		if batched.Load() {
			return fakes.Response{Chunks: step, Batches: []int{len(step)}}
		}
		return fakes.Response{Chunks: step}
	}}
	c := dialGateway(b, fakes.Serve(b, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }))
	req := &llmv1.GenerateRequest{Provider: "fake", Model: "m", SessionId: "s", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER}}}
	const steps = 200
	var ms runtime.MemStats
	run := func(batch bool) (time.Duration, uint64) {
		batched.Store(batch)
		runtime.ReadMemStats(&ms)
		a0, c0 := ms.Mallocs, cputime.Process()
		for range steps {
			n := 0
			for _, err := range c.Generate(context.Background(), req) {
				if err != nil {
					b.Fatal(err)
				}
				n++
			}
			if n != len(step) {
				b.Fatalf("%d chunks, want %d", n, len(step))
			}
		}
		cpu := (cputime.Process() - c0) / steps
		runtime.ReadMemStats(&ms)
		return cpu, (ms.Mallocs - a0) / steps
	}
	run(false)
	run(true)
	var single, batch, ratio []float64
	var aSingle, aBatch uint64
	i := 0
	for b.Loop() {
		var s, bt time.Duration
		if i%2 == 0 {
			s, aSingle = run(false)
			bt, aBatch = run(true)
		} else {
			bt, aBatch = run(true)
			s, aSingle = run(false)
		}
		i++
		single, batch, ratio = append(single, float64(s)), append(batch, float64(bt)), append(ratio, float64(bt)/float64(s))
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(single)/1e3, "single-cpu-µs/step")
	b.ReportMetric(med(batch)/1e3, "batched-cpu-µs/step")
	b.ReportMetric(med(ratio), "batched/single")
	b.ReportMetric(float64(aSingle), "single-allocs/step")
	b.ReportMetric(float64(aBatch), "batched-allocs/step")
}
