package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
)

func textBlocks(s string) []*llmv1.ContentBlock {
	return []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}}
}

// checkTurn asserts the shape of one scripted turn: contiguous seqs from
// from, two bash calls with their outputs, a completed turn/end.
func checkTurn(t *testing.T, evs []*sessionv1.SessionEvent, from int64) {
	t.Helper()
	var calls, results []string
	for i, ev := range evs {
		if ev.GetSeq() != from+int64(i) {
			t.Fatalf("event %d has seq %d, want %d", i, ev.GetSeq(), from+int64(i))
		}
		switch p := ev.GetPayload().(type) {
		case *sessionv1.SessionEvent_ToolCall:
			calls = append(calls, p.ToolCall.GetName())
		case *sessionv1.SessionEvent_ToolResult:
			var b strings.Builder
			for _, c := range p.ToolResult.GetContent() {
				b.WriteString(c.GetText().GetText())
			}
			if p.ToolResult.GetIsError() {
				t.Fatalf("tool result %s is an error: %s", p.ToolResult.GetCallId(), b.String())
			}
			results = append(results, b.String())
		}
	}
	if len(calls) != 2 || calls[0] != "bash" || calls[1] != "bash" {
		t.Fatalf("tool calls = %v, want two bash calls", calls)
	}
	if len(results) != 2 || !strings.Contains(results[0], "one") || !strings.Contains(results[1], "two") {
		t.Fatalf("tool results = %q, want outputs of echo one and echo two", results)
	}
	end := evs[len(evs)-1].GetTurnEnd()
	if end == nil || end.GetReason().GetCompleted() == nil {
		t.Fatalf("last event = %v, want a completed turn/end", evs[len(evs)-1])
	}
}

func checkSame(t *testing.T, what string, got, want []*sessionv1.SessionEvent) {
	t.Helper()
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("%s differ from the API stream (-api +%s):\n%s", what, what, diff)
	}
}

func TestSessionEndToEnd(t *testing.T) {
	t.Parallel()
	endToEnd(t, startStack(t))
}

// TestSessionEndToEndPostgres runs the same scenario with the agent on the
// PostgreSQL store (chosen through the environment: DSH_STORE,
// DSH_POSTGRES_DSN).
func TestSessionEndToEndPostgres(t *testing.T) {
	t.Parallel()
	endToEnd(t, startStack(t, "DSH_STORE=postgres", "DSH_POSTGRES_DSN="+pgtest.Database(t)))
}

// endToEnd runs a multi-step turn, checks the API stream, JetStream and the
// derived messages, restarts the agent and runs a second turn.
func endToEnd(t *testing.T, s *stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	id := s.createSession(ctx)

	// One multi-step, tool-using turn through the API.
	first := s.runTurn(ctx, id, 0, "run the two commands")
	checkTurn(t, first, 0)

	// The same events in JetStream: count, order, no duplicates.
	checkSame(t, "jetstream events", jetStreamEvents(t, s.nats.URL(), id, len(first)), first)

	// The derived messages.
	msgs, err := s.client.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(session.DeriveMessages(first), msgs.GetMessages(), protocmp.Transform()); diff != "" {
		t.Fatalf("GetMessages differs from deriveMessages of the stream (-want +got):\n%s", diff)
	}
	// Restart the agent: the persisted log comes back unchanged.
	s.agent.stop(t)
	s.startAgent()
	checkSame(t, "events after restart", storedLog(ctx, t, s, id), first)

	// The session goes on after the restart, and JetStream still ends with
	// every event exactly once, in order.
	second := s.runTurn(ctx, id, int64(len(first)), "again")
	checkTurn(t, second, int64(len(first)))
	all := append(append([]*sessionv1.SessionEvent(nil), first...), second...)
	checkSame(t, "jetstream events", jetStreamEvents(t, s.nats.URL(), id, len(all)), all)
}

func TestNATSOutage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	s := startStack(t)
	id := s.createSession(ctx)
	first := s.runTurn(ctx, id, 0, "before the outage")
	checkSame(t, "jetstream events", jetStreamEvents(t, s.nats.URL(), id, len(first)), first)

	s.nats.Stop()
	// The session keeps working while NATS is down.
	second := s.runTurn(ctx, id, int64(len(first)), "during the outage")
	checkTurn(t, second, int64(len(first)))
	if err := s.nats.Restart(); err != nil {
		t.Fatal(err)
	}
	all := append(append([]*sessionv1.SessionEvent(nil), first...), second...)
	checkSame(t, "jetstream events after the outage", jetStreamEvents(t, s.nats.URL(), id, len(all)), all)
}
