package agent_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

var heapProfile = flag.String("agent.heapprofile", "", "BenchmarkActiveSessionHeap: write a heap profile of the loaded sessions to this file")

// readResult is what the toolhost's `read` answers for the load ladder's
// notes.txt (40 numbered lines in its envelope, ~1.8 KB), and readArgs
// the ladder model's arguments.
var readResult = func() string {
	var b strings.Builder
	b.WriteString("<path>notes.txt</path>\n<type>file</type>\n<content>\n")
	for i := range 40 {
		b.WriteString(strconv.Itoa(i + 1))
		b.WriteString(": a line of notes for the load benchmark\n")
	}
	b.WriteString("\n(End of file - total 40 lines)\n</content>")
	return b.String()
}()

const readArgs = `{"file_path":"notes.txt"}`

// BenchmarkActiveSessionHeap is what the load ladder's sessions keep in
// the agent's heap between turns: per op, 200 sessions each run two turns
// of five `read` steps (the ladder's model and result sizes) and a final
// text step, and stay loaded. It reports the live heap plus goroutine
// stacks per session (B/session) and the live heap objects per session
// (objects/session), both after a collection, and per step (client,
// agent and fakes, all in this process) the CPU, allocations and bytes
// allocated; -agent.heapprofile writes the heap profile taken at the end.
func BenchmarkActiveSessionHeap(b *testing.B) {
	if *heapProfile != "" {
		defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
		runtime.MemProfileRate = 256
	}
	var budget atomic.Int64
	toolStep := fakes.ToolCalls("Step.", fakes.Call{ID: "call_1", Name: "read", Args: readArgs})
	textStep := fakes.Text("All done.")
	gw := &fakes.Gateway{Forget: true, Remember: true, Default: func(*llmv1.GenerateRequest) fakes.Response {
		if budget.Add(-1) >= 0 {
			return fakes.Response{Chunks: toolStep, Batches: []int{len(toolStep)}}
		}
		return fakes.Response{Chunks: textStep, Batches: []int{len(textStep)}}
	}}
	host := fakes.NewToolHost(fakes.Tool{Name: "read", Run: func(context.Context, *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{session.Text(readResult)}}
	}})
	sc := agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL"}
	sc.Gateway = fakes.ServeWith(b, []grpc.ServerOption{grpc.ForceServerCodecV2(fakes.SkipHistoryCodec{})},
		func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	sc.Toolhosts = []string{"fake=" + fakes.Serve(b, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })}
	svc, stop := benchAgentWith(b, sc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer stop()
	ctx := context.Background()
	const n = 200
	run := func(prefix string) {
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			if _, err := svc.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: id,
				Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
				b.Fatal(err)
			}
			for t := range 2 {
				budget.Store(5)
				if _, err := svc.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(fmt.Sprintf("session %d turn %d: read notes.txt five times", i, t))}}); err != nil {
					b.Fatal(err)
				}
				resp, err := svc.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id})
				if err != nil {
					b.Fatal(err)
				}
				if t == 1 && resp.GetSession().GetNextSeq() < 40 {
					b.Fatalf("%s holds %d events after two turns", id, resp.GetSession().GetNextSeq())
				}
			}
		}
	}
	run("warm") // warm pools and caches
	var bytes, objects, cpu, allocs, allocBytes float64
	const steps = n * 2 * 6 // two turns of five tool steps and a text step
	for i := 0; b.Loop(); i++ {
		d := measureRun(func() { run(fmt.Sprintf("s%d", i)) })
		cpu = float64(d.cpu.Microseconds()) / 1000 / steps
		bytes = d.live() / n
		objects = (float64(d.after.HeapObjects) - float64(d.before.HeapObjects)) / n
		allocs = float64(d.after.Mallocs-d.before.Mallocs) / steps
		allocBytes = float64(d.after.TotalAlloc-d.before.TotalAlloc) / steps
		if *heapProfile != "" {
			f, err := os.Create(*heapProfile)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	}
	b.ReportMetric(bytes, "B/session")
	b.ReportMetric(objects, "objects/session")
	b.ReportMetric(cpu, "cpu-ms/step")
	b.ReportMetric(allocs, "allocs/step")
	b.ReportMetric(allocBytes, "alloc-B/step")
}
