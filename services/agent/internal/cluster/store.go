package cluster

import (
	"context"
	"errors"

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
func (s *Store) Create(ctx context.Context, h *sessionv1.SessionHeader) error {
	if err := persistence.CheckHeader(h); err != nil {
		return err
	}
	if _, err := s.m.Acquire(ctx, h.GetId()); err != nil {
		return err
	}
	if err := s.FencedStore.Create(ctx, h); err != nil {
		if !errors.Is(err, persistence.ErrExists) {
			_ = s.m.Release(context.WithoutCancel(ctx), h.GetId())
		}
		return err
	}
	if err := s.FencedStore.Materialize(ctx, h.GetId()); err != nil {
		s.check(h.GetId(), err)
		if d, ok := s.FencedStore.(persistence.Discarder); ok {
			_ = d.Discard(context.WithoutCancel(ctx), h.GetId())
		}
		if !errors.Is(err, persistence.ErrExists) {
			_ = s.m.Release(context.WithoutCancel(ctx), h.GetId())
		}
		return err
	}
	return nil
}

// Load claims the session's lease (unless held), then loads it: the
// store's repair closes whatever a previous owner left open, under the new
// epoch.
func (s *Store) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
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
