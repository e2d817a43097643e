package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
)

// TestSweepAdoptsOrphans: the owner of a session is killed (SIGKILL) in the
// middle of a turn; with no request for the session, another replica's
// background sweep (--sweep-interval) claims it once the lease expired and
// its load closes the interrupted turn. A session whose owner stopped
// gracefully (lease released after its turn ended) is not an orphan and
// stays unclaimed.
func TestSweepAdoptsOrphans(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dsn := pgtest.Database(t)
	a := startStackWith(t, &stack{nats: natstest.Start(t), script: slowScript,
		agentEnv: []string{"DSH_STORE=postgres", "DSH_POSTGRES_DSN=" + dsn, "DSH_LEASE_TTL=1s", "DSH_SWEEP_INTERVAL=0"}})
	idle := a.createSession(ctx)
	a.runTurn(ctx, idle, 0, "finished")
	busy := a.createSession(ctx)
	if _, err := a.client.Send(ctx, &agentv1.SendRequest{SessionId: busy, Content: textBlocks("interrupted")}); err != nil {
		t.Fatal(err)
	}
	stream, err := a.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: busy})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("following A's turn: %v", err)
		}
		if session.TypeName(resp.GetEvent()) == session.TypeToolCall {
			break
		}
	}
	if err := a.agent.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.agent.done

	// B sweeps every 200 ms; nobody asks for either session.
	b := *a
	b.agentAddr = freeAddr(t)
	b.agentEnv = append(append([]string(nil), a.agentEnv...), "DSH_SWEEP_INTERVAL=200ms")
	b.startAgent()
	bPid := fmt.Sprintf("/%d/", b.agent.cmd.Process.Pid)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if owner, epoch := leaseOf(ctx, t, dsn, busy); strings.Contains(owner, bPid) && epoch == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's sweep did not adopt the orphaned session:\n%s", b.agent.out.String())
		}
	}
	// The sweep logs the adoption once the claimed session has loaded,
	// which follows the lease claim: wait for the line.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(b.agent.out.String(), "sweep: adopted an orphaned session"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("B claimed the session without its sweep:\n%s", b.agent.out.String())
		}
	}
	// The adopted session's turn is closed in the store.
	dialAgent(t, &b)
	log, err := readLog(ctx, &b, busy)
	if err != nil {
		t.Fatal(err)
	}
	if err := session.CheckLog(log); err != nil {
		t.Fatalf("adopted log: %v", err)
	}
	if _, ended := promptTurn(log, "interrupted"); !ended {
		t.Fatal("the adopted session's interrupted turn is still open")
	}
	// The session whose turn had ended was not swept: its lease is still
	// A's, at epoch 1.
	if owner, epoch := leaseOf(ctx, t, dsn, idle); strings.Contains(owner, bPid) || epoch != 1 {
		t.Fatalf("the finished session was swept: owner %q epoch %d", owner, epoch)
	}
}
