package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/natstest"
)

// drainScript: a turn of about two seconds (a tool call that sleeps, then a
// streamed answer), well inside the drain budget.
const drainScript = `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Sleeping.","tool_calls":[{"name":"bash","arguments":{"command":"sleep 1.5; echo slept","description":"sleep"}}]},
 {"text":"Slept and done.","delay_ms":20}
]}`

// TestDrainFinishesRunningTurn is issue 21's rollout guarantee on the real
// agent binary: SIGTERM arrives while a turn runs; at once readiness (the
// plaintext health port kubelet probes) is NOT_SERVING and new sessions and
// turns are refused, while the running turn finishes (turn/end completed,
// durable in the log) and the process exits 0 within its --drain-timeout.
func TestDrainFinishesRunningTurn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	healthAddr := freeAddr(t)
	s := startStackWith(t, &stack{nats: natstest.Start(t), script: drainScript,
		agentArgs: []string{"--health-listen", healthAddr, "--drain-timeout", "20s"}})
	id := s.createSession(ctx)
	other := s.createSession(ctx)

	hconn, err := grpcserver.Dial(healthAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	hc := healthpb.NewHealthClient(hconn)
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before SIGTERM: health %v, %v", resp.GetStatus(), err)
	}

	stream, err := s.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: textBlocks("sleep a little")}); err != nil {
		t.Fatal(err)
	}
	var seen []*sessionv1.SessionEvent
	next := func() *sessionv1.SessionEvent {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream after %d events: %v", len(seen), err)
		}
		seen = append(seen, resp.GetEvent())
		return resp.GetEvent()
	}
	for next().GetToolCall() == nil { // the turn is in its tool call
	}

	sigAt := time.Now()
	if err := s.agent.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Readiness flips before the turn can have ended (its tool still sleeps).
	for {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("health port during the drain: %v", err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
	}
	flipAt := time.Now()
	flipped := flipAt.Sub(sigAt)
	// New work is refused while the turn runs.
	if _, err := s.client.Send(ctx, &agentv1.SendRequest{SessionId: other, Content: textBlocks("too late")}); status.Code(err) != codes.Unavailable {
		t.Errorf("Send during the drain = %v, want UNAVAILABLE", err)
	}
	if _, err := s.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: s.workspace,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}}); status.Code(err) != codes.Unavailable {
		t.Errorf("CreateSession during the drain = %v, want UNAVAILABLE", err)
	}
	// A compaction is a turn of its own (a model call): refused as well, not
	// merely refused because a turn runs.
	if _, err := s.client.Compact(ctx, &agentv1.CompactRequest{SessionId: id}); status.Code(err) != codes.Unavailable {
		t.Errorf("Compact during the drain = %v, want UNAVAILABLE", err)
	}
	t.Logf("readiness NOT_SERVING %v after SIGTERM", flipped)

	select {
	case <-s.agent.done:
	case <-ctx.Done():
		t.Fatal("the agent did not exit")
	}
	if code := s.agent.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the agent exited %d after SIGTERM:\n%s", code, s.agent.out.String())
	}
	took := time.Since(sigAt)
	if took > 20*time.Second {
		t.Errorf("exit %v after SIGTERM, over the 20 s budget", took)
	}
	t.Logf("exited 0 %v after SIGTERM", took)

	// The log, read back by a fresh agent on the same data: turn 1 completed.
	s.startAgent()
	back, err := s.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var end *sessionv1.TurnEnd
	var resultAt int64
	for {
		resp, err := back.Recv()
		if err != nil {
			break
		}
		if e := resp.GetEvent().GetTurnEnd(); e != nil {
			end = e
		}
		if resp.GetEvent().GetToolResult() != nil {
			resultAt = resp.GetEvent().GetTime()
		}
	}
	if end.GetTurn() != 1 || end.GetReason().GetCompleted() == nil {
		t.Fatalf("turn 1 after the drain ended %v, want completed", end)
	}
	// "At once": readiness was NOT_SERVING while the tool still ran, not
	// after the turn (the old shutdown flipped it only when the server
	// stopped).
	if resultAt < flipAt.UnixMilli()-1 {
		t.Errorf("readiness flipped at %d ms, after the tool result at %d ms", flipAt.UnixMilli(), resultAt)
	}
}
