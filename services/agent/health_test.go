package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

// TestToolhostHealth: the agent reports its toolhost on the health service
// under HealthToolhost(name) and itself SERVING while the store is up; when
// the toolhost dies its name turns NOT_SERVING (the agent stays SERVING),
// OnToolhost hears it, and the model is told the host of the tool it calls
// is unavailable, not that the tool is unknown.
func TestToolhostHealth(t *testing.T) {
	t.Parallel()
	var stopHost func()
	type change struct {
		name string
		up   bool
	}
	changes := make(chan change, 8)
	e := newEnvFull(t, func(e *env) {
		addr, stop, err := fakes.Listen("127.0.0.1:0", func(s *grpc.Server) {
			toolsv1.RegisterToolHostServer(s, fakes.NewToolHost(fakes.Tool{Name: "echo"}))
		})
		if err != nil {
			t.Fatal(err)
		}
		e.thAddr, stopHost = addr, stop
		t.Cleanup(stop)
		e.onToolhost = func(name string, up bool, _ error) { changes <- change{name, up} }
	})
	if c := <-changes; c != (change{"fake", true}) {
		t.Fatalf("first toolhost state %v, want fake up", c)
	}
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	sctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	proctest.WaitServing(sctx, t, conn, "")
	watch, err := hc.Watch(t.Context(), &healthpb.HealthCheckRequest{Service: agent.HealthToolhost("fake")})
	if err != nil {
		t.Fatal(err)
	}
	want := func(st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("watch: %v", err)
			}
			if resp.GetStatus() == st {
				return
			}
		}
	}
	want(healthpb.HealthCheckResponse_SERVING)

	stopHost()
	if c := <-changes; c != (change{"fake", false}) {
		t.Fatalf("after the toolhost stopped: %v, want fake down", c)
	}
	want(healthpb.HealthCheckResponse_NOT_SERVING)
	for _, name := range []string{"", agent.HealthService, agent.HealthStore} {
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q with the store up: %v, %v; want SERVING", name, resp, err)
		}
	}

	e.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c1", Name: "echo", Args: `{}`})},
		fakes.Response{Chunks: fakes.Text("done")})
	id := e.create("").GetHeader().GetId()
	e.send(id, "use echo")
	e.waitIdle(id)
	var got string
	for _, ev := range e.events(id) {
		if r := ev.GetToolResult(); r != nil {
			got = r.GetError().GetCode() + " " + r.GetContent()[0].GetText().GetText()
		}
	}
	if !strings.HasPrefix(got, toolpipe.CodeHostUnavailable) || !strings.Contains(got, "the host of tool echo") {
		t.Fatalf("the model was told %q; want the host of tool echo unavailable", got)
	}
}
