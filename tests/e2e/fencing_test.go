package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
)

// slowScript is script with a first tool call that takes two seconds, so a
// turn is reliably in the middle of a tool call when the test pauses it.
const slowScript = `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Running a slow command.","tool_calls":[{"name":"bash","arguments":{"command":"sleep 2; echo one","description":"slow"}}]},
 {"text":"Done: {{last_tool_result}}"}
]}`

// TestFencingSIGSTOP: the owner of a session is frozen (SIGSTOP) in the
// middle of a turn, waiting for a tool; its lease expires, another replica
// claims the session (its load repairs the open turn under epoch 2) and runs
// a turn; then the old owner resumes (SIGCONT). Its next append is refused
// (SESSION_OWNERSHIP_LOST) and it
// steps down: it drops the session and forwards the session's calls to the
// new owner. The log has one writer per epoch: nothing changes after the
// new owner's turn, and it passes the invariant checker.
func TestFencingSIGSTOP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dsn := pgtest.Database(t)
	a := startStackWith(t, &stack{nats: natstest.Start(t), script: slowScript,
		agentEnv: []string{"DSH_STORE=postgres", "DSH_POSTGRES_DSN=" + dsn, "DSH_LEASE_TTL=1s"}})
	b := a.replica()
	id := a.createSession(ctx)

	// A runs a turn; freeze it once the slow tool call is in the log.
	if _, err := a.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: textBlocks("slow one")}); err != nil {
		t.Fatal(err)
	}
	sctx, stopStream := context.WithCancel(ctx)
	stream, err := a.client.StreamEvents(sctx, &agentv1.StreamEventsRequest{SessionId: id})
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
	if err := a.agent.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopStream()
	resumed := false
	defer func() {
		if !resumed {
			_ = a.agent.cmd.Process.Signal(syscall.SIGCONT) // so cleanup can stop it
		}
	}()

	// B claims the session once A's lease expired (its calls are forwarded
	// to the frozen A until then, and time out).
	var log []*sessionv1.SessionEvent
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		log, err = readLog(rctx, b, id)
		rcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B never took the session over: %v", err)
		}
	}
	if err := session.CheckLog(log); err != nil {
		t.Fatalf("log after B's repair: %v", err)
	}
	if _, ended := promptTurn(log, "slow one"); !ended {
		t.Fatal("B's load did not close A's interrupted turn")
	}
	after := b.runTurn(ctx, id, int64(len(log)), "after the takeover")
	log = append(log, after...)
	if _, ended := promptTurn(log, "after the takeover"); !ended {
		t.Fatal("B's turn did not end")
	}

	// The lease is B's, at epoch 2.
	owner, epoch := leaseOf(ctx, t, dsn, id)
	if epoch != 2 || !strings.Contains(owner, fmt.Sprintf("/%d/", b.agent.cmd.Process.Pid)) {
		t.Fatalf("lease after the takeover: owner %q epoch %d; want B (pid %d) at epoch 2", owner, epoch, b.agent.cmd.Process.Pid)
	}

	// A resumes: its append is refused, it drops the session.
	if err := a.agent.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(a.agent.out.String(), "dropping a session owned by another replica now"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A did not step down after SIGCONT:\n%s", a.agent.out.String())
		}
	}
	// Its write was refused: by the store's fence ("superseded by epoch
	// 2"), or, when its renewal noticed the loss first, by the store before
	// reaching the database; either way SESSION_OWNERSHIP_LOST.
	for deadline := time.Now().Add(10 * time.Second); !refusedFlush(a.agent.out.String()); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A's append after SIGCONT was not refused:\n%s", a.agent.out.String())
		}
	}

	// One writer per epoch: A wrote nothing; A now forwards to B.
	viaA, err := readLog(ctx, a, id)
	if err != nil {
		t.Fatalf("reading the log through A after it stepped down: %v", err)
	}
	checkSame(t, "log after A resumed", viaA, log)
	if owner2, epoch2 := leaseOf(ctx, t, dsn, id); owner2 != owner || epoch2 != 2 {
		t.Fatalf("lease after A resumed: %q epoch %d; want %q epoch 2", owner2, epoch2, owner)
	}
	if err := session.CheckLog(viaA); err != nil {
		t.Fatalf("final log: %v", err)
	}
}

// refusedFlush reports whether an agent's output shows a flush (an append)
// refused because the session belongs to another replica.
func refusedFlush(out string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "flush session") && strings.Contains(line, persistence.ErrFenced.Error()) {
			return true
		}
	}
	return false
}

// leaseOf reads a session's lease row.
func leaseOf(ctx context.Context, t *testing.T, dsn, id string) (owner string, epoch int64) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, `SELECT owner, epoch FROM dsh_leases WHERE session_id = $1`, id).Scan(&owner, &epoch); err != nil {
		t.Fatalf("lease of %s: %v", id, err)
	}
	return owner, epoch
}
