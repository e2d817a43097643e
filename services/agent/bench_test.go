package agent_test

import (
	"context"
	"fmt"
	"github.com/dsh-dev/dsh/internal/cputime"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/gateway"
)

// budgetGateway answers with one tool call per request while its budget
// lasts, then with a short text, each answer in one response (as the
// gateway sends a provider's burst when the request asks for batches,
// which the agent's do).
func budgetGateway(budget *atomic.Int64) *fakes.Gateway {
	toolStep := fakes.ToolCalls("", fakes.Call{ID: "c", Name: "noop", Args: `{}`})
	textStep := fakes.Text("done")
	return &fakes.Gateway{Default: func(*llmv1.GenerateRequest) fakes.Response {
		if budget.Add(-1) >= 0 {
			return fakes.Response{Chunks: toolStep, Batches: []int{len(toolStep)}}
		}
		return fakes.Response{Chunks: textStep, Batches: []int{len(textStep)}}
	}}
}

func benchAgent(b *testing.B, gwAddr, thAddr, dir, sync string) (agentv1.AgentServiceClient, func()) {
	b.Helper()
	return benchAgentWith(b, agent.ServerConfig{Gateway: gwAddr, Toolhosts: []string{"fake=" + thAddr}, DataDir: dir, Synchronous: sync},
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// benchAgentWith runs agent.Run with sc (its listener and service config
// filled in) and dials it with creds.
func benchAgentWith(b *testing.B, sc agent.ServerConfig, creds grpc.DialOption) (agentv1.AgentServiceClient, func()) {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sc.Listener, sc.Service.DefaultCwd, sc.NoTitles = lis, "/work", true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, sc, slog.New(slog.DiscardHandler)) }()
	conn, err := grpc.NewClient(lis.Addr().String(), creds)
	if err != nil {
		b.Fatal(err)
	}
	return agentv1.NewAgentServiceClient(conn), func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}
}

func turn(b *testing.B, c agentv1.AgentServiceClient, id string) {
	b.Helper()
	ctx := context.Background()
	if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("go")}}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStep is the harness overhead of one step (a model call with no
// provider delay that requests one trivial tool, the tool call, and the
// durable SQLite checkpoints before the request and before the tool body),
// measured after the session already holds `at` steps. ns/op is per step.
func BenchmarkStep(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, at := range []int{10, 100, 1000} {
			b.Run(fmt.Sprintf("sync=%s/at=%d", sync, at), func(b *testing.B) {
				benchSteps(b, at, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: sync},
					grpc.WithTransportCredentials(insecure.NewCredentials()))
			})
		}
	}
}

// BenchmarkStepNATS is BenchmarkStep at 100 steps (SQLite NORMAL) with the
// event fan-out on: every durable event is published to an embedded
// JetStream (in this process, so its CPU counts too), as a deployment with
// --nats-url does.
func BenchmarkStepNATS(b *testing.B) {
	benchSteps(b, 100, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL",
		NATS: events.Conn{URL: natstest.Start(b).URL()}},
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// BenchmarkStepRemembered is BenchmarkStep at 100 steps (SQLite NORMAL)
// against a gateway that holds each step's conversation, as the real one
// does: every step is sent as a reference plus the messages after it (the
// load ladder's requests), not as the whole history.
func BenchmarkStepRemembered(b *testing.B) {
	benchStepsOn(b, 100, true, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL"},
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// BenchmarkStepStores is BenchmarkStep at 100 steps on the durable stores
// in the same run: SQLite (synchronous FULL, a local file) and PostgreSQL
// (a replica's fenced store: every checkpoint is one dsh_append round trip
// to the server on a unix socket, the epoch checked inside). The postgres
// case also reports its ratio to the sqlite one (x-sqlite). The server
// starts when the postgres case asks for it (pgtest.Lazy in TestMain);
// without the binaries it skips unless DSH_REQUIRE_POSTGRES is set.
func BenchmarkStepStores(b *testing.B) {
	var sqliteNs float64
	b.Run("store=sqlite", func(b *testing.B) {
		benchSteps(b, 100, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "FULL"},
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		sqliteNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("store=postgres", func(b *testing.B) {
		benchSteps(b, 100, nil, agent.ServerConfig{Store: "postgres", PostgresDSN: pgtest.Database(b)},
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if sqliteNs > 0 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/sqliteNs, "x-sqlite")
		}
	})
}

// stepHarness runs the agent of sc against a budgetGateway (its budget
// the one given) and a toolhost with the trivial "noop" tool, each
// served with srvOpts, and dials it with creds.
func stepHarness(b *testing.B, budget *atomic.Int64, srvOpts []grpc.ServerOption, sc agent.ServerConfig, creds grpc.DialOption) (agentv1.AgentServiceClient, func()) {
	b.Helper()
	return stepHarnessOn(b, budgetGateway(budget), srvOpts, sc, creds)
}

// stepHarnessOn is stepHarness with the gateway gw.
func stepHarnessOn(b *testing.B, gw *fakes.Gateway, srvOpts []grpc.ServerOption, sc agent.ServerConfig, creds grpc.DialOption) (agentv1.AgentServiceClient, func()) {
	b.Helper()
	host := fakes.NewToolHost(fakes.Tool{Name: "noop", Run: func(context.Context, *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{session.Text("ok")}}
	}})
	sc.Gateway = fakes.ServeWith(b, append([]grpc.ServerOption{grpc.ForceServerCodecV2(fakes.SkipHistoryCodec{})}, srvOpts...),
		func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	sc.Toolhosts = []string{"fake=" + fakes.ServeWith(b, srvOpts, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })}
	return benchAgentWith(b, sc, creds)
}

// reportCPUPerOp reports the process CPU since cpu (cputime.Process) per
// op, over n ops, as cpu-ms/op.
func reportCPUPerOp(b *testing.B, cpu time.Duration, n int) {
	b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/1000/float64(n), "cpu-ms/op")
}

// benchSteps measures b.N steps after `at` warm-up steps, with a fake
// gateway and toolhost served with srvOpts and the agent run with sc and
// dialed with creds.
func benchSteps(b *testing.B, at int, srvOpts []grpc.ServerOption, sc agent.ServerConfig, creds grpc.DialOption) {
	b.Helper()
	benchStepsOn(b, at, false, srvOpts, sc, creds)
}

// benchStepsOn is benchSteps; with remember the fake gateway says it holds
// every step's conversation, as the real one does, so every step after the
// first goes out as a reference plus the new messages (the load ladder's
// requests).
func benchStepsOn(b *testing.B, at int, remember bool, srvOpts []grpc.ServerOption, sc agent.ServerConfig, creds grpc.DialOption) {
	b.Helper()
	var budget atomic.Int64
	gw := budgetGateway(&budget)
	gw.Remember = remember
	c, stop := stepHarnessOn(b, gw, srvOpts, sc, creds)
	defer stop()
	if _, err := c.CreateSession(context.Background(), &agentv1.CreateSessionRequest{SessionId: "bench",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
		b.Fatal(err)
	}
	budget.Store(int64(at))
	turn(b, c, "bench")
	budget.Store(int64(b.N))
	cpu := cputime.Process()
	b.ResetTimer()
	turn(b, c, "bench")
	b.StopTimer()
	// Process CPU per step (servers, agent and client share the process):
	// steadier than wall time on a shared machine.
	reportCPUPerOp(b, cpu, b.N)
}

// BenchmarkShortTurn is the harness overhead of a short turn (one step
// that requests a trivial tool, the tool call, and a final text step, with
// the durable SQLite checkpoints, NORMAL) after the session already holds
// 10 turns: unlike BenchmarkStep, every turn starts the session's driver
// afresh (it exits when the queue is empty, §3 of docs/arch/throughput.md),
// so the per-turn goroutine's cost counts. ns/op is per turn.
func BenchmarkShortTurn(b *testing.B) {
	var budget atomic.Int64
	c, stop := stepHarness(b, &budget, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL"},
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer stop()
	if _, err := c.CreateSession(context.Background(), &agentv1.CreateSessionRequest{SessionId: "bench",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
		b.Fatal(err)
	}
	for range 10 {
		budget.Store(1)
		turn(b, c, "bench")
	}
	cpu := cputime.Process()
	for b.Loop() {
		budget.Store(1)
		turn(b, c, "bench")
	}
	reportCPUPerOp(b, cpu, b.N)
}

// BenchmarkFreshSessionTurn is the load ladder's pattern in one process: per
// op a new session (CreateSession) runs one turn of five tool steps and a
// final text step (SQLite NORMAL), so what a session pays once — its
// first request header logged, its driver started and grown — counts as
// in the ladder, where every session runs one such turn. ns/op is per
// session (six steps).
func BenchmarkFreshSessionTurn(b *testing.B) {
	var budget atomic.Int64
	c, stop := stepHarness(b, &budget, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL"},
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer stop()
	n := 0
	session1 := func() {
		n++
		id := fmt.Sprintf("s%d", n)
		if _, err := c.CreateSession(context.Background(), &agentv1.CreateSessionRequest{SessionId: id,
			Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
			b.Fatal(err)
		}
		budget.Store(5)
		turn(b, c, id)
	}
	for range 10 {
		session1()
	}
	cpu := cputime.Process()
	for b.Loop() {
		session1()
	}
	reportCPUPerOp(b, cpu, b.N)
}

// seed runs turns until the session holds at least n events.
func seed(b *testing.B, c agentv1.AgentServiceClient, id string, n int64, budget *atomic.Int64) {
	b.Helper()
	for {
		resp, err := c.GetSession(context.Background(), &agentv1.GetSessionRequest{SessionId: id})
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetSession().GetNextSeq() >= n {
			return
		}
		budget.Store(20)
		turn(b, c, id)
	}
}

// BenchmarkResume10k is the time to load a persisted 10,000-event session
// (store load, log validation, derivation, a new driver) on a command.
func BenchmarkResume10k(b *testing.B) {
	var budget atomic.Int64
	gw := budgetGateway(&budget)
	host := fakes.NewToolHost(fakes.Tool{Name: "noop"})
	gwAddr := fakes.Serve(b, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	thAddr := fakes.Serve(b, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
	dir := b.TempDir()
	c, stop := benchAgent(b, gwAddr, thAddr, dir, "NORMAL")
	if _, err := c.CreateSession(context.Background(), &agentv1.CreateSessionRequest{SessionId: "big",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
		b.Fatal(err)
	}
	seed(b, c, "big", 10_000, &budget)
	stop()

	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(dir, "sessions.db")})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	conn, err := grpc.NewClient(gwAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	svc, err := agent.New(agent.Config{}, agent.Deps{Store: store, LLM: gateway.New(conn)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close(ctx)
	var events int64
	cpu := cputime.Process()
	n := 0
	for b.Loop() {
		n++
		// WaitIdle loads the session (GetSession answers an unloaded SQLite
		// session from its header without loading it).
		resp, err := svc.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "big"})
		if err != nil {
			b.Fatal(err)
		}
		events = resp.GetSession().GetNextSeq()
		if !svc.Unload(ctx, "big") {
			b.Fatal("could not unload")
		}
	}
	b.ReportMetric(float64(events), "events")
	reportCPUPerOp(b, cpu, n)
}

// BenchmarkIdleUnloadedSessionMemory reports the heap a session keeps after
// it ran a turn and was unloaded (B/session).
func BenchmarkIdleUnloadedSessionMemory(b *testing.B) { benchIdleSessionMemory(b, true) }

// BenchmarkIdleLoadedSessionMemory reports what a session holds while it
// stays loaded but idle after a turn: heap plus goroutine stacks
// (B/session), and its goroutines (goroutines/session; 0: no parked driver).
func BenchmarkIdleLoadedSessionMemory(b *testing.B) { benchIdleSessionMemory(b, false) }

func benchIdleSessionMemory(b *testing.B, unload bool) {
	var budget atomic.Int64
	gw := budgetGateway(&budget)
	gwAddr := fakes.Serve(b, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(b.TempDir(), "sessions.db"), Synchronous: "NORMAL"})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	conn, err := grpc.NewClient(gwAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	svc, err := agent.New(agent.Config{}, agent.Deps{Store: store, LLM: gateway.New(conn)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close(ctx)
	const n = 200
	run := func(prefix string) {
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			if _, err := svc.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: id, Cwd: "/work",
				Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
				b.Fatal(err)
			}
			if _, err := svc.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("hi")}}); err != nil {
				b.Fatal(err)
			}
			if _, err := svc.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for unload && !svc.Unload(ctx, id) {
				if time.Now().After(deadline) {
					b.Fatalf("%s never unloaded", id)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	run("warm") // warm pools and caches
	var per, goroutines float64
	for i := 0; b.Loop(); i++ {
		d := measureRun(func() { run(fmt.Sprintf("s%d", i)) })
		goroutines = float64(d.goroutines) / n
		per = d.live() / n
	}
	b.ReportMetric(per, "B/session")
	b.ReportMetric(goroutines, "goroutines/session")
}

// runDelta is what one run of a benchmark's workload cost and left behind,
// between two full collections.
type runDelta struct {
	before, after runtime.MemStats
	cpu           time.Duration // process CPU during the run (before the second collection)
	goroutines    int           // goroutines the run left running
}

// measureRun runs run between two full collections and reports its delta.
func measureRun(run func()) runDelta {
	var d runDelta
	runtime.GC()
	runtime.ReadMemStats(&d.before)
	g0 := runtime.NumGoroutine()
	cpu0 := cputime.Process()
	run()
	d.cpu = cputime.Process() - cpu0
	runtime.GC()
	runtime.ReadMemStats(&d.after)
	d.goroutines = runtime.NumGoroutine() - g0
	return d
}

// live is the heap and stack bytes the run left live.
func (d runDelta) live() float64 {
	return float64(d.after.HeapAlloc+d.after.StackInuse) - float64(d.before.HeapAlloc+d.before.StackInuse)
}
