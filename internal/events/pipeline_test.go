package events

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/natstest"
)

// zeroCursors is a Cursors that never published anything.
type zeroCursors struct{}

func (zeroCursors) PublishedCursor(context.Context, string) (int64, error)  { return 0, nil }
func (zeroCursors) SetPublishedCursor(context.Context, string, int64) error { return nil }

// TestReusedMessageKeepsNoBody: once an event is published, the window's
// reused message holds none of its bytes (they belong to the queue, which
// releases them).
func TestReusedMessageKeepsNoBody(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	p, err := New(t.Context(), Config{Conn: Conn{URL: srv.URL()}, Store: zeroCursors{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	defer func() { _ = p.Close(ctx) }()
	p.Durable("", "s", []*sessionv1.SessionEvent{{Seq: 0, Time: 1}, {Seq: 1, Time: 2}})
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if d := p.win.msg.msg.Data; d != nil { // Flush saw the round end under p.mu
		t.Fatalf("the reused message still holds %d bytes of the last event", len(d))
	}
}

func TestAckError(t *testing.T) {
	t.Parallel()
	noResponders := nats.Header{"Status": []string{"503"}}
	tests := []struct {
		name string
		hdr  nats.Header
		data string
		want string // "" for an acknowledgement; else a part of the error
	}{
		{name: "stored", data: `{"stream":"DSH_EVENTS","seq":42}`},
		{name: "duplicate", data: `{"stream":"DSH_EVENTS","seq":42,"duplicate":true}`},
		{name: "stored, other field order", data: `{"seq":42,"stream":"DSH_EVENTS"}`},
		{name: "refused", data: `{"error":{"code":503,"err_code":10077,"description":"maximum messages per subject exceeded"},"stream":"DSH_EVENTS","seq":0}`, want: "maximum messages per subject exceeded"},
		{name: "another stream", data: `{"stream":"OTHER","seq":1}`, want: `stream "OTHER"`},
		{name: "a prefix of the name", data: `{"stream":"DSH_EVENTS_2","seq":1}`, want: `stream "DSH_EVENTS_2"`},
		{name: "no responders", hdr: noResponders, want: "no responders"},
		{name: "empty", want: "empty"},
		{name: "not JSON", data: `+OK`, want: "bad JetStream acknowledgement"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ackError(&nats.Msg{Header: tt.hdr, Data: []byte(tt.data)})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("ackError = %v, want an acknowledgement", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("ackError = %v, want an error with %q", err, tt.want)
			}
		})
	}
	var apiErr *jetstream.APIError
	if err := ackError(&nats.Msg{Data: []byte(tests[3].data)}); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
		t.Fatalf("refusal = %#v, want the server's APIError", err)
	}
}

// TestWindowSettlesInPublishOrder: replies may come in any order, but
// slots leave the window oldest first, and only once their reply came;
// replies to no waiting slot (unknown subjects, free slots, a second reply)
// change nothing.
func TestWindowSettlesInPublishOrder(t *testing.T) {
	t.Parallel()
	w := newWindow(3)
	w.prefix = "_INBOX.x."
	w.replies = []string{"_INBOX.x.0", "_INBOX.x.1", "_INBOX.x.2"}
	a, b := &sessionState{id: "a"}, &sessionState{id: "b"}
	ack := func(i int, data string) {
		w.reply(&nats.Msg{Subject: w.prefix + strconv.Itoa(i), Data: []byte(data)})
	}
	const ok = `{"stream":"DSH_EVENTS","seq":1}`
	now := time.Now()
	if i := w.push(a, 0, now); i != 0 {
		t.Fatalf("first slot %d", i)
	}
	w.push(b, 0, now)
	w.push(a, 1, now)
	if !w.full() {
		t.Fatal("three slots taken and the window is not full")
	}
	ack(1, ok)
	ack(2, `{"error":{"code":503,"description":"nope"}}`)
	ack(7, ok)                                                  // no such slot
	w.reply(&nats.Msg{Subject: "_INBOX.y.0", Data: []byte(ok)}) // another subscription's
	if _, popped := w.pop(false, nil); popped {
		t.Fatal("a slot left the window before the oldest one's reply")
	}
	ack(0, ok)
	want := []struct {
		s     *sessionState
		seq   int64
		state slotState
	}{{a, 0, slotAcked}, {b, 0, slotAcked}, {a, 1, slotFailed}}
	for _, wt := range want {
		sl, popped := w.pop(false, nil)
		if !popped || sl.s != wt.s || sl.seq != wt.seq || sl.state != wt.state {
			t.Fatalf("popped %+v (%v), want %s seq %d state %d", sl, popped, wt.s.id, wt.seq, wt.state)
		}
	}
	// The ring wraps: slot 0 is taken again; its earlier reply is spent
	// and a second one for the free slot 1 is ignored.
	if i := w.push(b, 1, now); i != 0 {
		t.Fatalf("slot %d after wrapping, want 0", i)
	}
	ack(1, ok)
	if _, popped := w.pop(false, nil); popped {
		t.Fatal("a reply to a free slot settled the waiting one")
	}
	// all fails what still waits.
	errGone := errors.New("gone")
	sl, popped := w.pop(true, errGone)
	if !popped || sl.state != slotAborted || !errors.Is(sl.err, errGone) || w.n != 0 {
		t.Fatalf("pop(all) = %+v %v, n %d", sl, popped, w.n)
	}
}
