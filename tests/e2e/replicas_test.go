package e2e

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
)

// replica starts another agent process of s's deployment (same
// environment, so the same database) on its own port.
func (s *stack) replica() *stack {
	s.t.Helper()
	r := *s
	r.agentAddr = freeAddr(s.t)
	r.startAgent()
	dialAgent(s.t, &r)
	return &r
}

// storedLog reads a session's whole log through an agent.
func storedLog(ctx context.Context, t *testing.T, s *stack, id string) []*sessionv1.SessionEvent {
	t.Helper()
	stream, err := s.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*sessionv1.SessionEvent
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatalf("StreamEvents after %d events: %v", len(evs), err)
		}
		evs = append(evs, resp.GetEvent())
	}
}

// TestReplicasHandOff runs two, then three agent processes on one
// PostgreSQL database. The owner of a session serves it; another replica
// forwards its calls to the owner (unary and streaming); a graceful stop
// releases the lease so the other replica continues the session at once;
// after a kill -9 the next replica claims the session once the lease
// expired. JetStream ends with every event exactly once, in order.
func TestReplicasHandOff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	a := startStack(t, "DSH_STORE=postgres", "DSH_POSTGRES_DSN="+pgtest.Database(t), "DSH_LEASE_TTL=2s")
	b := a.replica()
	id := a.createSession(ctx)
	first := a.runTurn(ctx, id, 0, "run the two commands")
	checkTurn(t, first, 0)

	// B forwards calls for A's session to A: a unary call, and a whole
	// turn (Send, and StreamEvents relayed message by message).
	got, err := b.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil || got.GetSession().GetNextSeq() != int64(len(first)) {
		t.Fatalf("GetSession through a non-owner = %v, %v; want the session at seq %d", got, err, len(first))
	}
	viaB := b.runTurn(ctx, id, int64(len(first)), "through b")
	checkTurn(t, viaB, int64(len(first)))
	all := append(append([]*sessionv1.SessionEvent(nil), first...), viaB...)
	if strings.Contains(b.agent.out.String(), "session loaded") {
		t.Fatalf("B loaded A's session instead of forwarding:\n%s", b.agent.out.String())
	}

	// A stops gracefully: its lease is released, B takes over at once.
	a.agent.stop(t)
	second := b.runTurn(ctx, id, int64(len(all)), "again")
	checkTurn(t, second, int64(len(all)))
	all = append(all, second...)

	// B dies (kill -9) holding the lease; C claims the session once the
	// lease expired, and goes on.
	c := a.replica()
	if err := b.agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-b.agent.done
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("GetSession on the replica after the owner died: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling the lease expiry (2 s)
	}
	log := storedLog(ctx, t, c, id)
	checkSame(t, "log after failover", log, all)
	third := c.runTurn(ctx, id, int64(len(all)), "once more")
	checkTurn(t, third, int64(len(all)))
	all = append(all, third...)
	if err := session.CheckLog(all); err != nil {
		t.Fatalf("log after two hand-offs: %v", err)
	}
	checkSame(t, "jetstream events", jetStreamEvents(t, a.nats.URL(), id, len(all)), all)
}
