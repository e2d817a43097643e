package agent_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/llmgateway"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestGatewayReplicasEachTakeTraffic is issue 21's balanced gateways: the
// agent dials one name that resolves to three real gateway servers (in a
// cluster dns:/// of the headless Service; here a resolver listing three
// loopback addresses) and its model calls are spread round-robin, so every
// replica takes turns, not only the first one connected.
func TestGatewayReplicasEachTakeTraffic(t *testing.T) {
	t.Parallel()
	const replicas, turns = 3, 9
	var calls [replicas]atomic.Int64
	var addrs []resolver.Address
	for i := range replicas {
		gw, err := llmgateway.New(llmgateway.Config{Routes: []llmgateway.RouteConfig{{Name: "scripted", Kind: "scripted",
			Script: fmt.Sprintf(`{"steps": [{"text": "gateway %d"}]}`, i)}}}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(gw.Close)
		count := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if strings.HasSuffix(info.FullMethod, "/Generate") {
				calls[i].Add(1)
			}
			return h(srv, ss)
		})
		addrs = append(addrs, resolver.Address{Addr: fakes.ServeWith(t, []grpc.ServerOption{count}, gw.Register)})
	}
	r := manual.NewBuilderWithScheme("gateways")
	r.InitialState(resolver.State{Addresses: addrs})
	ws := t.TempDir()
	host := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws))
	p := startAgentWith(t, backend{gwAddr: r.Scheme() + ":///llmgateway", thAddr: host.Addr}, t.TempDir(), func(sc *agent.ServerConfig) {
		sc.DialOptions = append(sc.DialOptions, grpc.WithResolvers(r))
		sc.Service.DefaultCwd = ws
	})
	ctx := t.Context()
	for range turns {
		created, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}})
		if err != nil {
			t.Fatal(err)
		}
		id := created.GetSession().GetHeader().GetId()
		events := follow(t, ctx, p.client, id)
		if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("hi")}}); err != nil {
			t.Fatal(err)
		}
		evs := until(t, events, "the turn to end", turnEnd(1))
		if end := evs[len(evs)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil {
			t.Fatalf("turn ended %v", end)
		}
	}
	var got []int64
	for i := range calls {
		got = append(got, calls[i].Load())
	}
	t.Logf("model calls per gateway replica: %v", got)
	var total int64
	for i, n := range got {
		total += n
		if n == 0 {
			t.Errorf("gateway replica %d took no model call of %d turns (per replica: %v)", i, turns, got)
		}
	}
	if total != turns {
		t.Errorf("%d model calls, want %d", total, turns)
	}
}
