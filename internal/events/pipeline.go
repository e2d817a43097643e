package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The publish pipeline: every event message goes out as a plain core-NATS
// publish whose reply subject is a slot of the window, and JetStream's
// acknowledgement comes back on the publisher's own reply subscription
// (a channel subscription read by the publisher's goroutine). Against
// jetstream.PublishMsgAsync this costs no future, no channels and no timer
// per message, no JSON decoding of an ordinary acknowledgement, and no
// goroutine between the connection's reader and the publisher; the window
// spans sessions, so one round trip covers every dirty session's events
// instead of one round trip per session.

// slot is one published event awaiting JetStream's acknowledgement.
type slot struct {
	s     *sessionState
	seq   int64
	at    time.Time // when the event was queued (the publish lag's start)
	state slotState
	err   error // the refusal (slotFailed) or why the wait ended (slotAborted)
}

type slotState uint8

const (
	slotWaiting slotState = iota
	slotAcked
	slotFailed  // refused by JetStream (an error reply)
	slotAborted // its reply was given up on (a timeout, a lost connection)
)

// window is the publisher's pipeline of unacknowledged publishes: a ring of
// len(slots) slots in publish order. Slot i's reply subject is replies[i],
// made once per subscription; a slot is reused only after its reply came,
// and when replies are abandoned (a timeout, a lost connection) the
// subscription is replaced, so a late reply can never be taken for a later
// publish's.
type window struct {
	slots   []slot
	head, n int
	sub     *nats.Subscription
	acks    chan *nats.Msg
	prefix  string
	replies []string
	timer   *time.Timer
	msg     msgBuilder
	lags    []time.Time // settle's, reused
}

func newWindow(size int) *window {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &window{slots: make([]slot, size), timer: t, msg: newMsgBuilder(true)}
}

// subscribe makes the reply subscription when there is none.
func (w *window) subscribe(nc *nats.Conn) error {
	if w.sub != nil {
		return nil
	}
	prefix := nc.NewInbox() + "."
	// Room for every reply the window can wait for, twice over: a reply
	// that finds the channel full would be dropped by the client.
	acks := make(chan *nats.Msg, 2*len(w.slots))
	sub, err := nc.ChanSubscribe(prefix+"*", acks)
	if err != nil {
		return fmt.Errorf("events: reply subscription: %w", err)
	}
	w.sub, w.acks, w.prefix = sub, acks, prefix
	w.replies = make([]string, len(w.slots))
	for i := range w.replies {
		w.replies[i] = prefix + strconv.Itoa(i)
	}
	return nil
}

// abandon drops the reply subscription: the replies still owed to it are
// never matched with a later publish.
func (w *window) abandon() {
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
	w.sub, w.acks, w.replies = nil, nil, nil
}

// full reports whether every slot is waiting.
func (w *window) full() bool { return w.n == len(w.slots) }

// push takes the next slot for an event of s and returns its index.
func (w *window) push(s *sessionState, seq int64, at time.Time) int {
	i := (w.head + w.n) % len(w.slots)
	w.slots[i] = slot{s: s, seq: seq, at: at}
	w.n++
	return i
}

// unpush gives back the slot push took last (its publish failed at once).
func (w *window) unpush() {
	w.n--
	w.slots[(w.head+w.n)%len(w.slots)] = slot{}
}

// reply records a reply: the acknowledgement, or the refusal, of the
// publish its subject names. A reply to no waiting slot is ignored.
func (w *window) reply(m *nats.Msg) {
	tok, ok := strings.CutPrefix(m.Subject, w.prefix)
	if !ok {
		return
	}
	i, err := strconv.Atoi(tok)
	if err != nil || i < 0 || i >= len(w.slots) || (i-w.head+len(w.slots))%len(w.slots) >= w.n {
		return
	}
	sl := &w.slots[i]
	if sl.state != slotWaiting {
		return
	}
	if err := ackError(m); err != nil {
		sl.state, sl.err = slotFailed, err
		return
	}
	sl.state = slotAcked
}

// pop returns the oldest slot when its reply came (or when all is true,
// whatever its state: a waiting one is then aborted with err), and frees it.
func (w *window) pop(all bool, err error) (slot, bool) {
	if w.n == 0 {
		return slot{}, false
	}
	sl := w.slots[w.head]
	if sl.state == slotWaiting {
		if !all {
			return slot{}, false
		}
		sl.state, sl.err = slotAborted, err
	}
	w.slots[w.head] = slot{}
	w.head = (w.head + 1) % len(w.slots)
	w.n--
	return sl, true
}

// ackPrefix starts every acknowledgement of a message stored in the stream:
// the server writes the stream's name first.
var ackPrefix = []byte(`{"stream":"` + StreamName + `",`)

var errNoResponders = errors.New("events: no JetStream stream answered (no responders)")

// ackError reads JetStream's reply to a publish: nil for an acknowledgement
// of a message stored (or de-duplicated) in DSH_EVENTS, else why not. An
// ordinary acknowledgement is recognised by its first bytes; anything else
// is decoded in full.
func ackError(m *nats.Msg) error {
	if bytes.HasPrefix(m.Data, ackPrefix) {
		return nil
	}
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return errNoResponders
		}
		return errors.New("events: empty JetStream acknowledgement")
	}
	var r struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("events: bad JetStream acknowledgement %q: %w", m.Data, err)
	}
	if r.Error != nil {
		return r.Error
	}
	if r.Stream != StreamName {
		return fmt.Errorf("events: acknowledged by stream %q, not %s", r.Stream, StreamName)
	}
	return nil
}

// msgBuilder builds event messages into one reused nats.Msg and header map:
// PublishMsg copies the message into the connection's buffer before it
// returns, so the publisher's next message may overwrite it. A message
// costs one allocation here (the string holding the message id and, as its
// tail, the seq).
type msgBuilder struct {
	msg                              nats.Msg
	typ, seq, sid, tenant, id, delta []string // the map's value slices, one element each
}

// newMsgBuilder makes a builder; with expectStream its messages carry
// Nats-Expected-Stream: DSH_EVENTS, so JetStream stores them in no other
// stream.
func newMsgBuilder(expectStream bool) msgBuilder {
	h := make(nats.Header, 7)
	one := func(k string) []string {
		v := make([]string, 1)
		h[k] = v
		return v
	}
	b := msgBuilder{typ: one(HeaderEventType), seq: one(HeaderSeq), sid: one(HeaderSessionID), tenant: one(HeaderTenant), id: one(nats.MsgIdHdr),
		delta: []string{"1"}}
	if expectStream {
		h[jetstream.ExpectedStreamHeader] = []string{StreamName}
	}
	b.msg.Header = h
	return b
}
