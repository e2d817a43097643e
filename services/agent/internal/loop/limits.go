package loop

import (
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
)

// Default inbox bounds (docs/API.md "Limits").
const (
	DefaultMaxQueuedItems = 100
	DefaultMaxQueuedBytes = 64 << 20
)

// QueueLimits bound what one session holds in its two FIFOs (queued sends
// and steering): item count and encoded bytes of their content and contexts.
// Zero fields take the defaults; a negative field means unbounded.
type QueueLimits struct {
	MaxItems int
	MaxBytes int64
	// Process, when set, is the budget every session of the process shares.
	Process *ProcessBudget
}

func (q QueueLimits) items() int {
	if q.MaxItems == 0 {
		return DefaultMaxQueuedItems
	}
	return q.MaxItems
}

func (q QueueLimits) bytes() int64 {
	if q.MaxBytes == 0 {
		return DefaultMaxQueuedBytes
	}
	return q.MaxBytes
}

// ProcessBudget bounds the queued items and bytes of every session of a
// process together. It is safe for concurrent use.
type ProcessBudget struct {
	maxItems int   // <= 0: unbounded
	maxBytes int64 // <= 0: unbounded

	mu    sync.Mutex
	items int
	bytes int64
}

// NewProcessBudget returns a budget; a bound <= 0 is unbounded.
func NewProcessBudget(maxItems int, maxBytes int64) *ProcessBudget {
	return &ProcessBudget{maxItems: maxItems, maxBytes: maxBytes}
}

func (b *ProcessBudget) take(size int64) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.maxItems > 0 && b.items+1 > b.maxItems {
		return &QueueFullError{Scope: "process", What: "queued items", Limit: int64(b.maxItems)}
	}
	if b.maxBytes > 0 && b.bytes+size > b.maxBytes {
		return &QueueFullError{Scope: "process", What: "queued bytes", Limit: b.maxBytes}
	}
	b.items++
	b.bytes += size
	return nil
}

func (b *ProcessBudget) give(size int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.items--
	b.bytes -= size
	b.mu.Unlock()
}

// Usage returns the items and bytes queued process-wide.
func (b *ProcessBudget) Usage() (int, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.items, b.bytes
}

// QueueFullError refuses a send or steer that would exceed a bound.
type QueueFullError struct {
	Scope string // "session" or "process"
	What  string // "queued items" or "queued bytes"
	Limit int64
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("%s queue full: the limit of %d %s is reached; wait for queued turns to run (WaitIdle) or cancel them", e.Scope, e.Limit, e.What)
}

// itemSize is the encoded size an item holds in memory, roughly.
func itemSize(it Item) int64 {
	n := int64(0)
	for _, b := range it.Content {
		n += int64(proto.Size(b))
	}
	for _, c := range it.Contexts {
		n += int64(proto.Size(c))
	}
	return n
}

// admitLocked accounts for it in the session's and the process's bounds, or
// refuses it. a.mu must be held.
func (a *Agent) admitLocked(it *Item) error {
	lim := a.cfg.Limits
	if max := lim.items(); max > 0 && len(a.queued)+len(a.steering)+1 > max {
		return &QueueFullError{Scope: "session", What: "queued items", Limit: int64(max)}
	}
	it.size = itemSize(*it)
	if max := lim.bytes(); max > 0 && a.queuedBytes+it.size > max {
		return &QueueFullError{Scope: "session", What: "queued bytes", Limit: max}
	}
	if err := lim.Process.take(it.size); err != nil {
		return err
	}
	it.admitted = true
	a.queuedBytes += it.size
	return nil
}

// releaseLocked returns the bounds the items held. a.mu must be held.
func (a *Agent) releaseLocked(items ...Item) {
	for _, it := range items {
		if it.admitted {
			a.queuedBytes -= it.size
			a.cfg.Limits.Process.give(it.size)
		}
	}
}
