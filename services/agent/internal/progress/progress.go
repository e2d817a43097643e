// Package progress fans live tool output of one session out to its
// StreamEvents subscribers.
//
// Progress is live and not durable: the session log keeps only a call's
// result, never its intermediate output. Publishing never blocks: each
// subscriber has a bounded buffer, and a message that does not fit is
// dropped for that subscriber and counted, so a slow client can never
// stall a tool or the loop.
package progress

import (
	"sync"
	"sync/atomic"
	"unicode/utf8"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// DefaultBuffer is a subscriber's buffer when Subscribe is given none.
const DefaultBuffer = 256

// MaxText bounds the text of one progress message; longer output is cut
// (at a rune boundary) and marked.
const MaxText = 64 << 10

// Hub is the fan-out of one session. The zero value is not usable; use
// NewHub.
type Hub struct {
	mu      sync.Mutex
	subs    map[*Sub]struct{}
	dropped atomic.Int64
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[*Sub]struct{}{}} }

// Sub is one subscriber.
type Sub struct {
	h       *Hub
	c       chan *agentv1.ToolProgress
	dropped atomic.Int64
}

// C delivers the subscriber's progress in publication order.
func (s *Sub) C() <-chan *agentv1.ToolProgress { return s.c }

// Dropped is how many messages this subscriber lost to a full buffer.
func (s *Sub) Dropped() int64 { return s.dropped.Load() }

// Close unsubscribes; C is not closed (a publisher may still hold it).
func (s *Sub) Close() {
	s.h.mu.Lock()
	delete(s.h.subs, s)
	s.h.mu.Unlock()
}

// Subscribe adds a subscriber with a buffer of n messages (<= 0:
// DefaultBuffer).
func (h *Hub) Subscribe(n int) *Sub {
	if n <= 0 {
		n = DefaultBuffer
	}
	s := &Sub{h: h, c: make(chan *agentv1.ToolProgress, n)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

// Active reports whether anyone listens (publishers may skip building a
// message otherwise).
func (h *Hub) Active() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) > 0
}

// Publish hands p to every subscriber without blocking; a full subscriber
// loses it (counted). The text is bounded by MaxText.
func (h *Hub) Publish(p *agentv1.ToolProgress) {
	if out := p.GetOutput(); len(out.GetText()) > MaxText {
		t := out.GetText()[:MaxText]
		for len(t) > 0 && !utf8.ValidString(t) {
			t = t[:len(t)-1]
		}
		out.Text = t + "\n[progress output truncated]\n"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		select {
		case s.c <- p:
		default:
			s.dropped.Add(1)
			h.dropped.Add(1)
		}
	}
}

// Dropped is how many messages all subscribers together lost.
func (h *Hub) Dropped() int64 { return h.dropped.Load() }
