package agent_test

import (
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// TestRepairAtLoadIsPublished: a session stored with an interrupted turn
// (the process died mid-turn) is repaired when a later RPC loads it; the
// repair's events reach JetStream without waiting for the session's next
// event. The start's catch-up ran before the load, so only a catch-up after
// the load can publish them (the chaos test's missing tail).
func TestRepairAtLoadIsPublished(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(c *agent.Config) { c.Sink = nil })
	e.gw.Script(fakes.Response{Chunks: fakes.Text("one")})
	e.create("crashed")
	e.send("crashed", "hi")
	e.waitIdle("crashed")
	e.stop()

	// What a crash mid-turn leaves: a turn/start and its prompt, no end.
	st, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: filepath.Join(e.dir, "sessions.db")})
	if err != nil {
		t.Fatal(err)
	}
	h, evs, err := st.Load(t.Context(), "crashed")
	if err != nil {
		t.Fatal(err)
	}
	log, err := session.NewLog(h, evs)
	if err != nil {
		t.Fatal(err)
	}
	start, err := log.Append(session.TurnStartEvent(log.NextTurn(), session.MessageTrigger(session.UserSource())))
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := log.Append(session.UserMessageEvent([]*llmv1.ContentBlock{session.Text("again")}, session.UserSource()))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Append(t.Context(), "crashed", []*sessionv1.SessionEvent{start, prompt}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	stored := len(evs) + 2

	e.start()
	// The start's catch-up publishes the stored log; wait for it so the
	// load below surely comes after it.
	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	published := func() uint64 {
		stream, err := js.Stream(t.Context(), events.StreamName)
		if err != nil {
			return 0
		}
		info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(events.SessionEvents("crashed")))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}
	waitUntil(t, "the stored log published", func() bool { return published() == uint64(stored) })

	repaired := len(e.events("crashed")) // loads the session: repair closes the turn
	if repaired <= stored {
		t.Fatalf("the load appended no repair events (%d stored, %d now)", stored, repaired)
	}
	waitUntil(t, "the repair events published", func() bool { return published() == uint64(repaired) })
}
