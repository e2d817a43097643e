package persistence

import (
	"context"
	"errors"
	"slices"
	"sync"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// Appender is the part of a Store that Buffer writes through.
type Appender interface {
	Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error
}

// Buffer is the write-behind buffer between a live session log and a Store:
// the agent adds every committed event (typically from a session.Log
// observer) and calls Flush at its checkpoints (after turn/end, before a
// model call or a tool body, on shutdown).
//
// # Delivery
//
// Flush appends everything buffered for the session as one durable batch and
// drops it from the buffer only when the Append succeeded. On failure the
// events stay buffered, in order, ahead of anything added later, so the next
// Flush retries them: the in-memory log stays ahead of the store and no event
// is lost or reordered. When a retried batch finds part of itself already
// stored (an earlier Append committed but its result was lost), Flush drops
// the stored prefix and appends the rest.
//
// Buffer is safe for concurrent use. Flushes of one session are serialised;
// Add never blocks on I/O.
type Buffer struct {
	store Appender

	mu       sync.Mutex
	sessions map[string]*bufSession
}

type bufSession struct {
	flushMu sync.Mutex                // serialises Flush for the session
	pending []*sessionv1.SessionEvent // guarded by Buffer.mu
}

// NewBuffer returns a Buffer that flushes into store.
func NewBuffer(store Appender) *Buffer {
	return &Buffer{store: store, sessions: make(map[string]*bufSession)}
}

func (b *Buffer) session(id string) *bufSession {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[id]
	if s == nil {
		s = &bufSession{}
		b.sessions[id] = s
	}
	return s
}

// Add buffers committed events of a session, in log order. The events must
// not be mutated afterwards (a session.Log hands out immutable events).
func (b *Buffer) Add(id string, events ...*sessionv1.SessionEvent) {
	if len(events) == 0 {
		return
	}
	s := b.session(id)
	b.mu.Lock()
	s.pending = append(s.pending, events...)
	b.mu.Unlock()
}

// Pending returns how many events of the session await a flush.
func (b *Buffer) Pending(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil {
		return len(s.pending)
	}
	return 0
}

// Flush durably appends every event buffered for the session when the call
// starts. Events added while it runs wait for the next Flush. Flushing a
// session with nothing buffered returns nil at once.
func (b *Buffer) Flush(ctx context.Context, id string) error {
	s := b.session(id)
	s.flushMu.Lock()
	defer s.flushMu.Unlock()

	b.mu.Lock()
	batch := slices.Clone(s.pending)
	b.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}

	err := b.store.Append(ctx, id, batch)
	var seqErr *SeqError
	if errors.As(err, &seqErr) && seqErr.Index == 0 {
		// The store may already hold a prefix of the batch: drop it and
		// append the rest.
		first := batch[0].GetSeq()
		last := batch[len(batch)-1].GetSeq()
		if seqErr.Want > first && seqErr.Want <= last+1 {
			stored := int(seqErr.Want - first)
			b.drop(s, stored)
			batch = batch[stored:]
			if len(batch) == 0 {
				return nil
			}
			err = b.store.Append(ctx, id, batch)
		}
	}
	if err != nil {
		return err
	}
	b.drop(s, len(batch))
	return nil
}

// drop removes the first n pending events of s.
func (b *Buffer) drop(s *bufSession, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s.pending = slices.Delete(s.pending, 0, n)
	if len(s.pending) == 0 {
		s.pending = nil
	}
}

// FlushAll flushes every session with buffered events and joins the errors.
func (b *Buffer) FlushAll(ctx context.Context) error {
	b.mu.Lock()
	ids := make([]string, 0, len(b.sessions))
	for id, s := range b.sessions {
		if len(s.pending) > 0 {
			ids = append(ids, id)
		}
	}
	b.mu.Unlock()
	slices.Sort(ids)
	var errs []error
	for _, id := range ids {
		if err := b.Flush(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Forget releases the session's buffer state and returns the events that
// were still pending (nil when all were flushed). Call it after the final
// Flush of a disposed session.
func (b *Buffer) Forget(id string) []*sessionv1.SessionEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[id]
	delete(b.sessions, id)
	if s == nil {
		return nil
	}
	return s.pending
}
