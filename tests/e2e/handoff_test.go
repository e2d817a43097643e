package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/pgtest"
)

// handoffScript: every turn's tool sleeps long enough to keep a replica
// draining while the test acts.
const handoffScript = `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Sleeping.","tool_calls":[{"name":"bash","arguments":{"command":"sleep 3; echo slept","description":"sleep"}}]},
 {"text":"Done."}
]}`

// TestDrainHandsIdleSessionsOff: a replica told to stop keeps its running
// turn until it ends, but releases the leases of its idle sessions at once,
// so another replica serves their next turn during the drain instead of
// forwarding it to the draining replica (which refuses it).
func TestDrainHandsIdleSessionsOff(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.Database(t)
	a := startStackWith(t, &stack{nats: natstest.Start(t), script: handoffScript,
		agentEnv:  []string{"DSH_STORE=postgres", "DSH_POSTGRES_DSN=" + dsn, "DSH_LEASE_TTL=30s"},
		agentArgs: []string{"--drain-timeout", "20s"}})
	b := a.replica()
	idle, busy := a.createSession(ctx), a.createSession(ctx)
	// One turn makes the idle session durable (a session is stored with
	// its first events).
	if _, err := a.client.Send(ctx, &agentv1.SendRequest{SessionId: idle, Content: textBlocks("hi")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: idle}); err != nil {
		t.Fatal(err)
	}

	stream, err := a.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: busy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.Send(ctx, &agentv1.SendRequest{SessionId: busy, Content: textBlocks("sleep")}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("following the busy turn: %v", err)
		}
		if resp.GetEvent().GetToolCall() != nil {
			break // the busy turn sleeps in its tool
		}
	}
	if err := a.agent.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s:\n%s", what, a.agent.out.String())
			}
		}
	}
	waitFor("the idle session's hand-off", func() bool {
		return strings.Contains(a.agent.out.String(), "drain: handed an idle session off")
	})

	// B runs the idle session's next turn while A still drains.
	if _, err := b.client.Send(ctx, &agentv1.SendRequest{SessionId: idle, Content: textBlocks("hello from B")}); err != nil {
		t.Fatalf("Send to the handed-off session through another replica during the drain: %v", err)
	}
	select {
	case <-a.agent.done:
		t.Fatal("A exited before B took the handed-off session: the test proves nothing")
	default:
	}
	if _, err := b.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: idle}); err != nil {
		t.Fatal(err)
	}
	if _, ended := promptTurn(storedLog(ctx, t, b, idle), "hello from B"); !ended {
		t.Fatal("the handed-off session's turn on B did not end")
	}

	// A's running turn still finishes within its budget.
	select {
	case <-a.agent.done:
	case <-ctx.Done():
		t.Fatal("A did not exit")
	}
	if code := a.agent.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("A exited %d:\n%s", code, a.agent.out.String())
	}
	if _, ended := promptTurn(storedLog(ctx, t, b, busy), "sleep"); !ended {
		t.Fatal("the busy session's turn did not end")
	}
}
