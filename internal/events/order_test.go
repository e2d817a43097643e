package events_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/proctest"
)

// storingReader is a store on which the agent appends while the publisher
// reads: during the first read of session id from seq at, after the read
// saw the log and before it returns, event at is stored, handed to the
// publisher and followed by IDLE.
type storingReader struct {
	*memStore
	p    atomic.Pointer[events.Publisher]
	id   string
	at   int64
	once sync.Once
}

func (r *storingReader) ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error) {
	evs, err := readerStore{r.memStore}.ReadEvents(ctx, id, from)
	if id == r.id && from == r.at {
		r.once.Do(func() {
			ev := mkEvents(r.at, r.at+1)
			r.mu.Lock()
			r.logs[id] = append(r.logs[id], ev...)
			r.mu.Unlock()
			p := r.p.Load()
			p.Durable("t", id, ev)
			p.Status("t", id, agentv1.AgentStatus_AGENT_STATUS_IDLE)
		})
	}
	return evs, err
}

// TestStatusWaitsForAnEventStoredDuringTheRead: a catch-up's store read
// finds nothing at seq 3, and the agent stores event 3 and queues IDLE
// while it runs; a subscriber of both subjects sees event 3 before IDLE.
func TestStatusWaitsForAnEventStoredDuringTheRead(t *testing.T) {
	t.Parallel()
	srv, nc := startWithClient(t)
	msgs := make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe("dsh.>", msgs); err != nil { // one subscription: the publisher's order
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mem := newMemStore()
	mem.logs["r"] = mkEvents(0, 3)
	store := &storingReader{memStore: mem, id: "r", at: 3}
	p := newPublisher(t, srv.URL(), store, nil)
	store.p.Store(p)
	p.CatchUp(&sessionv1.SessionHeader{Id: "r", Tenant: "t"})
	var seen []int64
	for {
		var m *nats.Msg
		select {
		case m = <-msgs:
		case <-time.After(10 * time.Second):
			t.Fatalf("no IDLE; events seen %v", seen)
		}
		if strings.HasPrefix(m.Subject, "dsh.status.") {
			break
		}
		_, ev, err := events.DecodeEvent(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ev.GetSeq())
	}
	if len(seen) != 4 || seen[3] != 3 {
		t.Fatalf("events before IDLE: %v, want [0 1 2 3] (IDLE went out before event 3)", seen)
	}
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "r", 4)
}

// TestRefusedThenStoredIsWarned: JetStream refuses event 1 (over the
// stream's max message size) and stores events 2 and 3, in the window with
// it; the resync then moves the cursor past the stream's tail and so past
// event 1 — the known gap — and the publisher says so in a warning naming
// the session and the seqs.
func TestRefusedThenStoredIsWarned(t *testing.T) {
	t.Parallel()
	srv, nc := startWithClient(t)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{events.AllEvents},
		MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	var logs proctest.Buffer // written by the publisher's goroutines
	store := newMemStore()
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	evs := mkEvents(0, 4)
	evs[1] = &sessionv1.SessionEvent{Seq: 1, Time: 1001, Payload: &sessionv1.SessionEvent_ContextMessage{ContextMessage: &sessionv1.ContextMessage{
		Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: strings.Repeat("x", 4096)}}}}}}}
	p.Durable("", "gap", evs)
	flush(t, p)
	var got []int64
	for _, m := range readStream(t, srv.URL()) {
		got = append(got, m.seq)
	}
	out := logs.String()
	for _, want := range []string{"a refused event is skipped", "session=gap", "refused_seq=1", "cursor=1", "stream_tail=4"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q (stream holds seqs %v); log:\n%s", want, got, out)
		}
	}
}

// countingReader counts a store's reads and the events they returned.
type countingReader struct {
	readerStore
	reads, events atomic.Int64
}

func (c *countingReader) ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error) {
	evs, err := c.readerStore.ReadEvents(ctx, id, from)
	c.reads.Add(1)
	c.events.Add(int64(len(evs)))
	return evs, err
}

// TestCatchUpReadsTheStoreOnce: a catch-up of 2,000 stored events through a
// window of 64 reads the log about once per QueueLimit events (the events
// in the window count against the limit, so a read adds at least
// QueueLimit-64) and once more to find its end, not once per batch (~32).
func TestCatchUpReadsTheStoreOnce(t *testing.T) {
	t.Parallel()
	const n = 2000
	for _, tc := range []struct {
		name       string
		queueLimit int
		maxReads   int64
	}{
		{"default queue", 0, 2},
		{"queue of 500", 500, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t)
			mem := newMemStore()
			mem.logs["c"] = mkEvents(0, n)
			store := &countingReader{readerStore: readerStore{mem}}
			p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.BatchSize = 64; c.QueueLimit = tc.queueLimit })
			p.CatchUp(&sessionv1.SessionHeader{Id: "c"})
			flush(t, p)
			checkExactlyOnce(t, readStream(t, srv.URL()), "c", n)
			if r, e := store.reads.Load(), store.events.Load(); r > tc.maxReads {
				t.Fatalf("%d reads returning %d events for %d events, want at most %d reads", r, e, n, tc.maxReads)
			}
		})
	}
}

// TestRefusedRetriesLeaveNoGap: once JetStream has refused a session's
// event, its retries put that event into the window alone until it is
// acknowledged. The stream first refuses events 3–5 (the subject is full),
// then takes small events but not event 3 (over a max message size set
// meanwhile): a retry that sent 3, 4 and 5 together would get 4 and 5
// stored without 3 and the cursor would skip it (the gap the warning of
// TestRefusedThenStoredIsWarned names). Alone, event 3 is refused until
// the size limit goes, and then the session is in the stream whole, in
// order, without a warning.
func TestRefusedRetriesLeaveNoGap(t *testing.T) {
	t.Parallel()
	srv, _, js, cfg := threePerSubject(t)
	var logs proctest.Buffer // written by the publisher's goroutines
	p := newPublisher(t, srv.URL(), newMemStore(), func(c *events.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	evs := mkEvents(0, 6)
	evs[3] = &sessionv1.SessionEvent{Seq: 3, Time: 1003, Payload: &sessionv1.SessionEvent_ContextMessage{ContextMessage: &sessionv1.ContextMessage{
		Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: strings.Repeat("x", 4096)}}}}}}}
	p.Durable("", "g", evs)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if out := logs.String(); strings.Contains(out, "a refused event is skipped") {
				t.Fatalf("the cursor skipped a refused event (waiting for %s); log:\n%s", what, out)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s after 15 s; log:\n%s", what, logs.String())
			}
		}
	}
	waitFor("three events published and three refused", func() bool { return p.Pending() == 3 })
	cfg.MaxMsgsPerSubject, cfg.MaxMsgSize = 100, 1024
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	retries := func() int { return strings.Count(logs.String(), "publish failed; retrying") }
	after := retries()
	waitFor("two retries with the size limit", func() bool { return retries() >= after+2 })
	checkExactlyOnce(t, readStream(t, srv.URL()), "g", 3)
	cfg.MaxMsgSize = -1
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "g", 6)
	if out := logs.String(); strings.Contains(out, "a refused event is skipped") {
		t.Fatalf("the cursor skipped a refused event; log:\n%s", out)
	}
}

// repairingReader is a store on which a replica's load repairs a session
// while the publisher reads it: during the first read of session id from
// seq at, after the read's snapshot and before it returns, events at..to-1
// are stored (the repair closing an interrupted turn, written by Load with
// no flush to hand them over) and CatchUp is called, as the agent does once
// Load returned.
type repairingReader struct {
	*memStore
	p      atomic.Pointer[events.Publisher]
	id     string
	at, to int64
	once   sync.Once
}

func (r *repairingReader) ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error) {
	evs, err := readerStore{r.memStore}.ReadEvents(ctx, id, from)
	if id == r.id && from == r.at {
		r.once.Do(func() {
			r.mu.Lock()
			r.logs[id] = append(r.logs[id], mkEvents(r.at, r.to)...)
			r.mu.Unlock()
			r.p.Load().CatchUp(&sessionv1.SessionHeader{Id: id, Tenant: "t"})
		})
	}
	return evs, err
}

// TestCatchUpDuringTheSweepsRead: a claim's catch-up reads session "x"
// past its last event (3) and finds nothing; meanwhile the load's repair
// stores events 3–5 and asks for a catch-up again. The read that began
// before the repair must not end the sweep that began after it: events
// 3–5 reach the stream (TestChaosReplicas once found a repair missing).
func TestCatchUpDuringTheSweepsRead(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	mem := newMemStore()
	mem.logs["x"] = mkEvents(0, 3)
	store := &repairingReader{memStore: mem, id: "x", at: 3, to: 6}
	p := newPublisher(t, srv.URL(), store, nil)
	store.p.Store(p)
	p.CatchUp(&sessionv1.SessionHeader{Id: "x", Tenant: "t"})
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "x", 6)
}
