package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsh-dev/dsh/internal/persistence"
)

// Lease is a session's ownership record. Times are the database's clock,
// so replicas' clocks need not agree.
type Lease struct {
	SessionID string
	Owner     string // replica id
	Address   string // where peers forward the session's RPCs
	Epoch     int64  // raised by every claim
	ExpiresAt time.Time
}

// HeldError reports a claim refused because another replica holds a live
// lease; Lease says which and where.
type HeldError struct{ Lease Lease }

func (e *HeldError) Error() string {
	return fmt.Sprintf("session %q is owned by replica %q at %s until %s", e.Lease.SessionID, e.Lease.Owner, e.Lease.Address, e.Lease.ExpiresAt.Format(time.RFC3339Nano))
}

// ErrNotFenced is returned by lease operations on a store opened without an
// Owner.
var ErrNotFenced = errors.New("pgstore: lease operations need a store opened with an Owner")

func (s *Store) leaseOp(ctx context.Context) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	if s.owner == "" {
		return ErrNotFenced
	}
	return nil
}

// Claim takes the session's lease for ttl when it is free, expired, or
// already this replica's, raising its epoch; from then on this store's
// appends to the session are fenced by that epoch. A live lease of another
// replica is a *HeldError. The caller then loads the session (Load repairs
// what the previous owner left open).
func (s *Store) Claim(ctx context.Context, id, address string, ttl time.Duration) (Lease, error) {
	if err := s.leaseOp(ctx); err != nil {
		return Lease{}, err
	}
	l := Lease{SessionID: id, Owner: s.owner, Address: address}
	err := s.pool.QueryRow(ctx, `
		INSERT INTO dsh_leases AS l (session_id, owner, address, epoch, expires_at)
		VALUES ($1, $2, $3, 1, now() + $4 * interval '1 microsecond')
		ON CONFLICT (session_id) DO UPDATE
			SET owner = excluded.owner, address = excluded.address, epoch = l.epoch + 1, expires_at = excluded.expires_at
			WHERE l.expires_at <= now() OR l.owner = excluded.owner
		RETURNING epoch, expires_at`, id, s.owner, address, ttl.Microseconds()).Scan(&l.Epoch, &l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, lerr := s.Lookup(ctx, id)
		if lerr != nil {
			return Lease{}, lerr
		}
		return Lease{}, &HeldError{Lease: cur}
	}
	if err != nil {
		return Lease{}, fmt.Errorf("session %q: claim: %w", id, err)
	}
	s.mu.Lock()
	s.held[id] = l.Epoch
	s.mu.Unlock()
	return l, nil
}

// RenewHeld extends the leases of sessions by ttl from now, in one
// statement. It returns those whose lease is lost (moved to another epoch,
// or already found lost by a fenced append): this store does not append to
// them. A lease that expired with nobody claiming it is renewed (its epoch
// did not move).
func (s *Store) RenewHeld(ctx context.Context, sessions []string, ttl time.Duration) (lost []string, err error) {
	if err := s.leaseOp(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	ids := make([]string, 0, len(sessions))
	epochs := make([]int64, 0, len(sessions))
	for _, id := range sessions {
		if e, ok := s.held[id]; ok {
			ids, epochs = append(ids, id), append(epochs, e)
		} else {
			lost = append(lost, id)
		}
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return lost, nil
	}
	rows, err := s.pool.Query(ctx, `UPDATE dsh_leases AS l SET expires_at = now() + $4 * interval '1 microsecond'
		FROM unnest($1::text[], $2::bigint[]) AS h(id, epoch)
		WHERE l.session_id = h.id AND l.owner = $3 AND l.epoch = h.epoch
		RETURNING l.session_id`, ids, epochs, s.owner, ttl.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("pgstore: renew leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return lost, fmt.Errorf("pgstore: renew leases: %w", err)
	}
	ok := make(map[string]bool, len(renewed))
	for _, id := range renewed {
		ok[id] = true
	}
	for i, id := range ids {
		if !ok[id] {
			s.forget(id, epochs[i])
			lost = append(lost, id)
		}
	}
	return lost, nil
}

// Release gives a held lease up (it expires now, keeping its epoch so that
// epochs never repeat) and stops this store's appends to the session.
func (s *Store) Release(ctx context.Context, id string) error {
	if err := s.leaseOp(ctx); err != nil {
		return err
	}
	epoch, ok := s.heldEpoch(id)
	if !ok {
		return nil
	}
	s.forget(id, epoch)
	if _, err := s.pool.Exec(ctx, `UPDATE dsh_leases SET expires_at = now() WHERE session_id = $1 AND owner = $2 AND epoch = $3`, id, s.owner, epoch); err != nil {
		return fmt.Errorf("session %q: release: %w", id, err)
	}
	return nil
}

// Lookup returns a session's lease row (persistence.ErrNotFound when the
// session was never claimed).
func (s *Store) Lookup(ctx context.Context, id string) (Lease, error) {
	if err := s.checkOpen(ctx); err != nil {
		return Lease{}, err
	}
	l := Lease{SessionID: id}
	err := s.pool.QueryRow(ctx, `SELECT owner, address, epoch, expires_at FROM dsh_leases WHERE session_id = $1`, id).
		Scan(&l.Owner, &l.Address, &l.Epoch, &l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, fmt.Errorf("session %q has no lease: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("session %q: lease: %w", id, err)
	}
	return l, nil
}

func (s *Store) heldEpoch(id string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[id]
	return e, ok
}

func (s *Store) forget(id string, epoch int64) {
	s.mu.Lock()
	if s.held[id] == epoch {
		delete(s.held, id)
	}
	s.mu.Unlock()
}

// Orphans returns up to limit sessions whose lease expired while a turn
// was open (the last turn/start has no turn/end after it): their owner died
// or hung mid-turn. A released lease (graceful hand-off, after the turns
// ended) is not an orphan. A replica's sweep claims and loads them, so the
// store's repair closes the interrupted turn without waiting for a request.
func (s *Store) Orphans(ctx context.Context, limit int) ([]string, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `
		SELECT l.session_id FROM dsh_leases l
		WHERE l.expires_at <= now()
		  AND coalesce((SELECT max(seq) FROM dsh_events e WHERE e.session_id = l.session_id AND e.type = 'turn/start'), -1)
		    > coalesce((SELECT max(seq) FROM dsh_events e WHERE e.session_id = l.session_id AND e.type = 'turn/end'), -1)
		ORDER BY l.expires_at
		LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: orphans: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgstore: orphans: %w", err)
	}
	return ids, nil
}
