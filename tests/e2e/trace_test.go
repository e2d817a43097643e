package e2e

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/llmgateway"
	"github.com/dsh-dev/dsh/services/toolhost"
)

// TestOneTurnIsOneTrace runs the three services in this process (over
// loopback gRPC, as `dsh dev` does) with the in-memory span recorder as the
// global tracer provider, and checks that one turn's spans from all three
// services share one trace id, rooted at the agent's turn span.
func TestOneTurnIsOneTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "e2e", SpanProcessors: []sdktrace.SpanProcessor{rec}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	logger := slog.New(slog.DiscardHandler)
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	serve := func(srv *grpcserver.Server, l net.Listener) {
		sctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = srv.Serve(sctx, l); close(done) }()
		t.Cleanup(func() { stop(); <-done })
	}

	gwCfg, err := llmgateway.ConfigFromEnv(func(k string) string {
		if k == "DSH_SCRIPT" {
			return script
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := llmgateway.New(gwCfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	gwLis, gwSrv := listen(), grpcserver.New(grpcserver.Config{Logger: logger})
	gw.Register(gwSrv.Server)
	serve(gwSrv, gwLis)

	ws := t.TempDir()
	th, err := toolhost.New(toolhost.Config{WorkspaceRoot: ws}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close() })
	thLis, thSrv := listen(), grpcserver.New(grpcserver.Config{Logger: logger})
	th.Register(thSrv.Server)
	serve(thSrv, thLis)

	agLis := listen()
	agCtx, agStop := context.WithCancel(context.Background())
	agDone := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		agDone <- agent.Run(agCtx, agent.ServerConfig{Listener: agLis, Gateway: gwLis.Addr().String(),
			Toolhosts: []string{"builtin=" + thLis.Addr().String()}, DataDir: t.TempDir(),
			// The title call after the turn is a trace of its own; this test
			// counts the spans of the turn's.
			NoTitles: true,
			Ready:    func(string) { close(ready) }}, logger)
	}()
	t.Cleanup(func() { agStop(); <-agDone })
	select {
	case <-ready:
	case err := <-agDone:
		t.Fatalf("agent: %v", err)
	}

	conn, err := grpcserver.Dial(agLis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := &stack{t: t, client: agentv1.NewAgentServiceClient(conn), workspace: ws}
	id := s.createSession(ctx)
	evs := s.runTurn(ctx, id, 0, "trace me")
	checkTurn(t, evs, 0)

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var turn sdktrace.ReadOnlySpan
	var generates, executes []sdktrace.ReadOnlySpan
	for _, sp := range spans {
		byID[sp.SpanContext().SpanID()] = sp
		switch {
		case sp.Name() == telemetry.SpanTurn:
			turn = sp
		case sp.Name() == "dsh.llm.v1.LlmGateway/Generate" && sp.SpanKind() == trace.SpanKindServer:
			generates = append(generates, sp)
		case (sp.Name() == "dsh.tools.v1.ToolHost/Execute" || sp.Name() == "dsh.tools.v1.ToolHost/PrepareExecute") && sp.SpanKind() == trace.SpanKindServer:
			// A batch of one call runs on PrepareExecute.
			executes = append(executes, sp)
		}
	}
	var names []string
	for _, sp := range spans {
		names = append(names, sp.Name())
	}
	if turn == nil {
		t.Fatalf("no %q span among %d spans: %s", telemetry.SpanTurn, len(spans), strings.Join(names, ", "))
	}
	if len(generates) != 3 || len(executes) != 2 {
		t.Fatalf("gateway Generate server spans = %d (want 3), toolhost Execute/PrepareExecute server spans = %d (want 2); spans: %s",
			len(generates), len(executes), strings.Join(names, ", "))
	}
	// Each server span descends from the turn span: gateway and toolhost
	// spans sit in the agent's trace, under its step, model-call and
	// tool-call spans.
	for _, sp := range append(generates, executes...) {
		if sp.SpanContext().TraceID() != turn.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, the turn in %s", sp.Name(), sp.SpanContext().TraceID(), turn.SpanContext().TraceID())
			continue
		}
		var chain []string
		cur := sp
		for cur != nil && cur.SpanContext().SpanID() != turn.SpanContext().SpanID() {
			chain = append(chain, cur.Name())
			cur = byID[cur.Parent().SpanID()]
		}
		if cur == nil {
			t.Errorf("%s does not descend from the turn span (chain %v)", sp.Name(), chain)
			continue
		}
		want := telemetry.SpanStep
		if len(chain) < 3 || chain[len(chain)-1] != want {
			t.Errorf("%s: ancestors %v, want ... -> %s -> %s", sp.Name(), chain, want, telemetry.SpanTurn)
		}
	}
	// A toolhost's span sits under the agent's execute_tool span of its
	// call (through the agent's client span of the RPC).
	for _, sp := range executes {
		var chain []string
		for cur := sp; cur != nil; cur = byID[cur.Parent().SpanID()] {
			chain = append(chain, cur.Name())
		}
		if !slices.ContainsFunc(chain, func(n string) bool { return strings.HasPrefix(n, "execute_tool ") }) {
			t.Errorf("%s: ancestors %v, want an execute_tool span among them", sp.Name(), chain)
		}
	}
}
