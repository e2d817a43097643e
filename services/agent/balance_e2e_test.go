package agent_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/gateway"
	"github.com/dsh-dev/dsh/services/llmgateway"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// gatewayReplicas is issue 21's balanced gateways: real gateway servers
// (the scripted provider; the remembered-conversation cache on, as by
// default) behind one name (in a cluster dns:/// of the headless Service;
// here a resolver listing their loopback addresses). It records which
// replica each Generate call of each session reached, how many named a
// remembered conversation, and how many a replica refused
// PREFIX_NOT_CACHED.
type gatewayReplicas struct {
	servers            []*grpc.Server
	mu                 sync.Mutex
	reached            map[string][]int // session id -> the replica of each call, in order
	referenced, misses atomic.Int64
	unlabelled         atomic.Int64 // calls whose session header was not their session id
}

func startGatewayReplicas(t *testing.T, n int) (*gatewayReplicas, *manual.Resolver) {
	t.Helper()
	g := &gatewayReplicas{reached: map[string][]int{}}
	var addrs []resolver.Address
	for i := range n {
		gw := scriptedGateway(t, fmt.Sprintf(`{"steps": [{"text": "gateway %d"}]}`, i))
		record := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if !strings.HasSuffix(info.FullMethod, "/Generate") {
				return h(srv, ss)
			}
			err := h(srv, &recordingStream{ServerStream: ss, g: g, replica: i})
			if st, ok := status.FromError(err); ok && st.Code() == codes.FailedPrecondition {
				for _, d := range st.Details() {
					if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == llmgateway.ReasonPrefixNotCached {
						g.misses.Add(1)
					}
				}
			}
			return err
		})
		addr, gs, err := fakes.ListenWith("127.0.0.1:0", []grpc.ServerOption{record}, gw.Register)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(gs.Stop)
		g.servers = append(g.servers, gs)
		addrs = append(addrs, resolver.Address{Addr: addr})
	}
	r := manual.NewBuilderWithScheme("gateways")
	r.InitialState(resolver.State{Addresses: addrs})
	return g, r
}

// recordingStream notes the request of a Generate call as the gateway reads
// it.
type recordingStream struct {
	grpc.ServerStream
	g       *gatewayReplicas
	replica int
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	req, ok := m.(*llmv1.GenerateRequest)
	if err != nil || !ok {
		return err
	}
	md, _ := metadata.FromIncomingContext(s.Context())
	if got := md.Get(gateway.SessionHeader); len(got) != 1 || got[0] != req.GetSessionId() {
		s.g.unlabelled.Add(1)
	}
	if req.GetPrefix() != nil {
		s.g.referenced.Add(1)
	}
	s.g.mu.Lock()
	s.g.reached[req.GetSessionId()] = append(s.g.reached[req.GetSessionId()], s.replica)
	s.g.mu.Unlock()
	return nil
}

// replicasOf returns the replica of each call of a session.
func (g *gatewayReplicas) replicasOf(id string) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.reached[id])
}

// startBalancedAgent starts an agent dialling the replicas' name.
func startBalancedAgent(t *testing.T, r *manual.Resolver) (*agentProc, string) {
	t.Helper()
	ws := t.TempDir()
	host := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws))
	p := startAgentWith(t, backend{gwAddr: r.Scheme() + ":///llmgateway", thAddr: host.Addr}, t.TempDir(), func(sc *agent.ServerConfig) {
		sc.DialOptions = append(sc.DialOptions, grpc.WithResolvers(r))
		sc.Service.DefaultCwd = ws
	})
	return p, ws
}

// runTurns sends n prompts to session id, one after the other's end
// (turns from+1 .. from+n), and fails unless each completed in one step.
func runTurns(t *testing.T, p *agentProc, id string, from, n int32) {
	t.Helper()
	ctx := t.Context()
	events := follow(t, ctx, p.client, id)
	for turn := from + 1; turn <= from+n; turn++ {
		if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(fmt.Sprintf("prompt %d", turn))}}); err != nil {
			t.Fatal(err)
		}
		evs := until(t, events, fmt.Sprintf("turn %d to end", turn), turnEnd(turn))
		steps := 0
		for _, ev := range evs {
			if ev.GetStepStart().GetTurn() == turn {
				steps++
			}
		}
		if end := evs[len(evs)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil || steps != 1 {
			t.Fatalf("session %s turn %d: %d steps (a retry is a step), ended %v; want 1 step, completed", id, turn, steps, end)
		}
	}
}

func createSession(t *testing.T, p *agentProc) string {
	t.Helper()
	created, err := p.client.CreateSession(t.Context(), &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}})
	if err != nil {
		t.Fatal(err)
	}
	return created.GetSession().GetHeader().GetId()
}

// TestGatewaySessionAffinity: the agent's model calls are session-affine
// over the gateway replicas (ring_hash on the session header): every step
// of a session reaches the same replica, the one that remembers its
// conversation, so a multi-step session over three replicas is never
// refused PREFIX_NOT_CACHED; different sessions spread over the replicas.
// The replicas are connected lazily: a session's first call finds its
// replica IDLE and waits for the connection (no step fails or is retried:
// runTurns checks each turn took exactly one step).
func TestGatewaySessionAffinity(t *testing.T) {
	t.Parallel()
	const replicas, turns = 3, 4
	// Sessions until they used more than one replica (at least minSessions,
	// at most maxSessions: all on one replica by chance is 3^-(n-1)).
	const minSessions, maxSessions = 6, 24
	g, r := startGatewayReplicas(t, replicas)
	p, _ := startBalancedAgent(t, r)
	used := map[int]int{} // replica -> sessions
	var ids []string
	for len(ids) < minSessions || (len(used) < 2 && len(ids) < maxSessions) {
		id := createSession(t, p)
		ids = append(ids, id)
		runTurns(t, p, id, 0, turns)
		got := g.replicasOf(id)
		if len(got) != turns {
			t.Fatalf("session %s: %d model calls %v, want %d", id, len(got), got, turns)
		}
		for _, i := range got[1:] {
			if i != got[0] {
				t.Errorf("session %s reached replicas %v, want one", id, got)
				break
			}
		}
		used[got[0]]++
	}
	t.Logf("%d sessions of %d steps; sessions per replica: %v", len(ids), turns, used)
	if len(used) < 2 {
		t.Errorf("%d sessions all reached one replica: %v", len(ids), used)
	}
	if m := g.misses.Load(); m != 0 {
		t.Errorf("%d PREFIX_NOT_CACHED refusals, want none", m)
	}
	// Every step after a session's first named the remembered conversation.
	if got, want := g.referenced.Load(), int64(len(ids)*(turns-1)); got != want {
		t.Errorf("%d requests named a remembered conversation, want %d", got, want)
	}
	if u := g.unlabelled.Load(); u != 0 {
		t.Errorf("%d Generate calls without their session id in %s", u, gateway.SessionHeader)
	}
}

// TestGatewayReplicaStoppedMidSession: the replica of a session stops
// (gracefully, as a pod being replaced) between its steps. The next step
// moves to another replica, which does not hold the conversation: one
// PREFIX_NOT_CACHED, the request sent whole, the step succeeds (not
// retried); the steps after are incremental again on the new replica.
func TestGatewayReplicaStoppedMidSession(t *testing.T) {
	t.Parallel()
	g, r := startGatewayReplicas(t, 3)
	p, _ := startBalancedAgent(t, r)
	id := createSession(t, p)
	runTurns(t, p, id, 0, 2)
	before := g.replicasOf(id)
	if len(before) != 2 || before[0] != before[1] {
		t.Fatalf("first two steps reached replicas %v, want one twice", before)
	}
	gone := before[0]
	g.servers[gone].GracefulStop()
	runTurns(t, p, id, 2, 2)
	after := g.replicasOf(id)[2:]
	// The refused request and its resend are two calls on the new replica.
	if len(after) != 3 || after[0] == gone || after[1] != after[0] || after[2] != after[0] {
		t.Fatalf("steps after replica %d stopped reached replicas %v, want one other replica three times (refused, resent, next step)", gone, after)
	}
	if m := g.misses.Load(); m != 1 {
		t.Errorf("%d PREFIX_NOT_CACHED refusals, want 1", m)
	}
	// Step 2, the refused step 3, and step 4 named a conversation.
	if got := g.referenced.Load(); got != 3 {
		t.Errorf("%d requests named a remembered conversation, want 3", got)
	}
	if u := g.unlabelled.Load(); u != 0 {
		t.Errorf("%d Generate calls without their session id in %s", u, gateway.SessionHeader)
	}
}
