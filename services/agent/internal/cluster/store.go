package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// FencedStore is a store whose appends are fenced by the leases of a
// Manager (pgstore.Store opened with an Owner).
type FencedStore interface {
	persistence.Store
	persistence.Reader
	Leases
	// Materialize stores a created, never appended session now.
	Materialize(ctx context.Context, id string) error
}

// Store is the store the agent uses on a replica: it claims a session's
// lease before creating or loading it (a live lease of another replica is
// an *OwnedElsewhereError), reports a fenced append to the Manager (which
// drops the session through OnLost), and releases the lease of a session
// the agent discards. Everything else passes through.
type Store struct {
	FencedStore
	m *Manager
	// claiming holds the ids whose Create or Load runs on this replica:
	// one at a time per id, so whether the lease was held before a call's
	// claim tells whether that call claimed it.
	claiming idLocks
}

var (
	_ persistence.Store     = (*Store)(nil)
	_ persistence.Reader    = (*Store)(nil)
	_ persistence.Discarder = (*Store)(nil)
)

// NewStore wraps s; m must manage the leases of s.
func NewStore(s FencedStore, m *Manager) *Store { return &Store{FencedStore: s, m: m} }

// Create claims the new session's lease, then registers and stores it
// (not lazily at its first append, as a lone agent may): every replica
// can then find the session its creator acknowledged, and forward to the
// creator or, once the creator died, claim it. Stored only at its first
// append, it would be "not found" on the other replicas and lost with its
// creator.
//
// An id that is taken is ErrExists without a claim: the stored header is
// read first, so a client-chosen id that collides with a session nobody
// holds (its owner stopped or died) does not move that session to this
// replica, whoever asked (another tenant among them). A session stored
// between that read and the claim (by a replica that let it go since) is
// ErrExists too, and the lease this call claimed for it is given up; a
// lease held before the call is kept.
func (s *Store) Create(ctx context.Context, h *sessionv1.SessionHeader) error {
	if err := persistence.CheckHeader(h); err != nil {
		return err
	}
	id := h.GetId()
	unlock, err := s.claiming.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.vacant(ctx, id); err != nil {
		return err
	}
	fresh := !s.m.Holds(id)
	if _, err := s.m.Acquire(ctx, id); err != nil {
		return err
	}
	if err := s.FencedStore.Create(ctx, h); err != nil {
		s.abandon(ctx, id, fresh, err)
		return err
	}
	if err := s.FencedStore.Materialize(ctx, id); err != nil {
		s.check(id, err)
		if d, ok := s.FencedStore.(persistence.Discarder); ok {
			_ = d.Discard(context.WithoutCancel(ctx), id)
		}
		s.abandon(ctx, id, fresh, err)
		return err
	}
	return nil
}

// vacant reports a stored session with the id as ErrExists (a replica's
// Create stores a session at once, so every created session is found).
func (s *Store) vacant(ctx context.Context, id string) error {
	_, err := s.FencedStore.ReadHeader(ctx, id)
	switch {
	case err == nil:
		return fmt.Errorf("session %q: %w", id, persistence.ErrExists)
	case errors.Is(err, persistence.ErrNotFound):
		return nil
	default:
		return fmt.Errorf("check that the id is free: %w", err)
	}
}

// abandon gives up the lease Create claimed for a session it could not
// create. On ErrExists only a lease this call claimed fresh is given up:
// one held before belongs to whoever holds the session here.
func (s *Store) abandon(ctx context.Context, id string, fresh bool, err error) {
	if fresh || !errors.Is(err, persistence.ErrExists) {
		_ = s.m.Release(context.WithoutCancel(ctx), id)
	}
}

// Load claims the session's lease (unless held), then loads it: the
// store's repair closes whatever a previous owner left open, under the new
// epoch.
func (s *Store) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	unlock, err := s.claiming.lock(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	if !s.m.Holds(id) {
		if _, err := s.m.Acquire(ctx, id); err != nil {
			return nil, nil, err
		}
	}
	h, evs, err := s.FencedStore.Load(ctx, id)
	s.check(id, err)
	if errors.Is(err, persistence.ErrNotFound) {
		_ = s.m.Release(context.WithoutCancel(ctx), id)
	}
	return h, evs, err
}

// Append appends; a fenced append tells the Manager the lease is lost.
func (s *Store) Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error {
	err := s.FencedStore.Append(ctx, id, events)
	s.check(id, err)
	return err
}

// Discard forgets the session and gives its lease up.
func (s *Store) Discard(ctx context.Context, id string) error {
	var err error
	if d, ok := s.FencedStore.(persistence.Discarder); ok {
		err = d.Discard(ctx, id)
	}
	return errors.Join(err, s.m.Release(ctx, id))
}

func (s *Store) check(id string, err error) {
	if errors.Is(err, persistence.ErrFenced) {
		s.m.Lost(id, err)
	}
}

// idLocks lets one call at a time work on a session id.
type idLocks struct {
	mu   sync.Mutex
	busy map[string]chan struct{} // closed when the holder unlocks
}

// lock waits until no other call holds id, then holds it until unlock is
// called; it gives up when ctx ends.
func (k *idLocks) lock(ctx context.Context, id string) (unlock func(), err error) {
	for {
		k.mu.Lock()
		wait, held := k.busy[id]
		if !held {
			if k.busy == nil {
				k.busy = make(map[string]chan struct{})
			}
			done := make(chan struct{})
			k.busy[id] = done
			k.mu.Unlock()
			return func() {
				k.mu.Lock()
				delete(k.busy, id)
				k.mu.Unlock()
				close(done)
			}, nil
		}
		k.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("session %q: waiting for another call on it: %w", id, ctx.Err())
		}
	}
}
