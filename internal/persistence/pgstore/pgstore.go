// Package pgstore is the PostgreSQL session store (github.com/jackc/pgx/v5),
// the backend several agent replicas share.
//
// Schema (see schema.go; versioned in dsh_schema_version, migrated at Open
// in one transaction, a newer version refused): dsh_sessions (one row per
// materialised session: header columns, the full header, the stored log
// length and the published cursor), dsh_events (one row per event: the
// event in protobuf binary plus seq, type and time columns; no second JSON
// copy, the dsh_event_log view and `dsh sessions dump` are for people) and
// dsh_leases (session ownership, see lease.go).
//
// # Delivery
//
// Every Append is one transaction: materialise the sessions row of a lazily
// created session, check the fence (when the store is fenced), advance
// next_seq only if it still equals the batch's first seq (*SeqError
// otherwise), insert every row with one statement, commit. With the
// server's default synchronous_commit=on the commit is flushed to the
// server's WAL before Append returns; any failure rolls the whole batch
// back.
//
// # Fencing
//
// A Store opened with an Owner is fenced: it appends to a session only
// while it holds that session's lease at the epoch it claimed (Claim). The
// append transaction reads the lease row FOR SHARE, so a competing Claim
// (which bumps the epoch) waits for it, and an append that starts after the
// claim sees the new epoch and fails with persistence.ErrFenced, writing
// nothing. The lease's expiry only decides when another replica may claim;
// the epoch decides who may write.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

// Config configures a Store.
type Config struct {
	// DSN is the connection string (URL or key=value) of the database.
	DSN string
	// MaxConns bounds the connection pool; default 8.
	MaxConns int32
	// Owner, when set, fences the store: this replica's id (unique per
	// process) in the lease table. Appends then need a claimed lease.
	Owner string
	// Logger; nil discards.
	Logger *slog.Logger
}

// Store is a persistence.Store over one PostgreSQL database.
type Store struct {
	pool  *pgxpool.Pool
	log   *slog.Logger
	owner string

	mu      sync.Mutex
	closed  bool
	pending map[string]*sessionv1.SessionHeader // created, not yet materialised
	held    map[string]int64                    // fenced: session -> claimed epoch
}

var (
	_ persistence.Store     = (*Store)(nil)
	_ persistence.Reader    = (*Store)(nil)
	_ persistence.Discarder = (*Store)(nil)
)

// Open connects to the database and migrates its schema.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.DSN == "" {
		return nil, errors.New("pgstore: empty DSN (set --postgres-dsn or DSH_POSTGRES_DSN)")
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgstore: DSN: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	if pc.MaxConns <= 0 {
		pc.MaxConns = 8
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s := &Store{pool: pool, log: cfg.Logger, owner: cfg.Owner,
		pending: make(map[string]*sessionv1.SessionHeader), held: make(map[string]int64)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return migrate(ctx, tx) }); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the pool.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.pool.Close()
	return nil
}

func (s *Store) checkOpen(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return persistence.ErrClosed
	}
	return nil
}

// Create registers a session; its sessions row is written by the first
// Append.
func (s *Store) Create(ctx context.Context, h *sessionv1.SessionHeader) error {
	if err := persistence.CheckHeader(h); err != nil {
		return err
	}
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	id := h.GetId()
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dsh_sessions WHERE id = $1)`, id).Scan(&exists); err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.pending[id]; dup || exists {
		return fmt.Errorf("session %q: %w", id, persistence.ErrExists)
	}
	s.pending[id] = proto.CloneOf(h)
	return nil
}

// Append durably appends one batch in one transaction.
func (s *Store) Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error {
	if len(events) == 0 {
		return ctx.Err()
	}
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	rows, err := encodeRows(id, events[0].GetSeq(), events)
	if err != nil {
		return err
	}
	s.mu.Lock()
	h := s.pending[id]
	s.mu.Unlock()
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if h != nil {
			if err := materialize(ctx, tx, h); err != nil {
				return err
			}
		}
		return s.appendRows(ctx, tx, id, rows)
	})
	if err != nil {
		return err
	}
	if h != nil {
		s.mu.Lock()
		if s.pending[id] == h {
			delete(s.pending, id)
		}
		s.mu.Unlock()
	}
	return nil
}

func materialize(ctx context.Context, tx pgx.Tx, h *sessionv1.SessionHeader) error {
	hb, err := persistence.MarshalHeader(h)
	if err != nil {
		return fmt.Errorf("session %q: header: %w", h.GetId(), err)
	}
	var seedLength *int64
	if h.SeedLength != nil {
		v := h.GetSeedLength()
		seedLength = &v
	}
	tag, err := tx.Exec(ctx, `INSERT INTO dsh_sessions (id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header, next_seq)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0) ON CONFLICT (id) DO NOTHING`,
		h.GetId(), h.GetVersion(), h.GetCreatedAt(), h.GetCwd(), h.GetParentSession(), seedLength, h.GetDelegationDepth(), string(hb))
	if err != nil {
		return fmt.Errorf("session %q: %w", h.GetId(), err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	return nil
}

// batch is the stored form of a batch, column by column.
type batch struct {
	first int64
	seqs  []int64
	types []string
	times []int64
	pbs   [][]byte
}

var pbMarshal = proto.MarshalOptions{Deterministic: true}

// encodeRows checks a batch (contiguity, the kernel's per-event rules) and
// encodes every event once, in protobuf binary.
func encodeRows(id string, next int64, events []*sessionv1.SessionEvent) (*batch, error) {
	if err := persistence.CheckBatch(id, next, events); err != nil {
		return nil, err
	}
	b := &batch{first: next, seqs: make([]int64, len(events)), types: make([]string, len(events)),
		times: make([]int64, len(events)), pbs: make([][]byte, len(events))}
	errs := make([]error, len(events))
	persistence.Parallel(len(events), 32, func(i int) {
		ev := events[i]
		typ := session.TypeName(ev)
		if typ == "" {
			errs[i] = &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: "(none)", Err: errors.New("event has no payload")}
			return
		}
		if err := session.ValidateEvent(ev); err != nil {
			errs[i] = &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
			return
		}
		pb, err := pbMarshal.Marshal(ev)
		if err != nil {
			errs[i] = &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
			return
		}
		b.seqs[i], b.types[i], b.times[i], b.pbs[i] = ev.GetSeq(), typ, ev.GetTime(), pb
	})
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// appendRows checks the fence, advances next_seq from the batch's first seq
// and inserts the rows, inside tx.
func (s *Store) appendRows(ctx context.Context, tx pgx.Tx, id string, b *batch) error {
	if err := s.checkFence(ctx, tx, id); err != nil {
		return err
	}
	n := int64(len(b.seqs))
	tag, err := tx.Exec(ctx, `UPDATE dsh_sessions SET next_seq = next_seq + $3 WHERE id = $1 AND next_seq = $2`, id, b.first, n)
	if err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		var next int64
		err := tx.QueryRow(ctx, `SELECT next_seq FROM dsh_sessions WHERE id = $1`, id).Scan(&next)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("session %q: %w", id, err)
		}
		return &persistence.SeqError{SessionID: id, Index: 0, Want: next, Got: b.first}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO dsh_events (session_id, seq, type, time, pb)
		SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::bytea[])`,
		id, b.seqs, b.types, b.times, b.pbs); err != nil {
		return fmt.Errorf("session %q: insert seqs %d..%d: %w", id, b.first, b.first+n-1, err)
	}
	return nil
}

// Discard forgets a created but never appended session.
func (s *Store) Discard(ctx context.Context, id string) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
	return nil
}
