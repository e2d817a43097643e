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
// Every Append is one statement, so one transaction and one round trip: the
// SQL function dsh_append checks the fence (when the store is fenced),
// materialises the sessions row of a lazily created session, advances
// next_seq only if it still equals the batch's first seq (*SeqError
// otherwise) and inserts every row. With the
// server's default synchronous_commit=on the commit is flushed to the
// server's WAL before Append returns; any failure rolls the whole batch
// back.
//
// # Fencing
//
// A Store opened with an Owner is fenced: it appends to a session only
// while it holds that session's lease at the epoch it claimed (Claim).
// dsh_append reads the lease row FOR SHARE, so a competing Claim
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
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Ping checks that the database answers (a round trip on a pooled
// connection): the agent's readiness.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: ping: %w", err)
	}
	return nil
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

// Materialize stores the sessions row of a created, never appended
// session now (a fenced store: under the session's lease), instead of
// with its first Append. A replica does it before CreateSession is
// acknowledged: a session that lives only in its creator's memory is
// "not found" on every other replica, and dies with its creator. A stored
// or unknown session is left alone.
func (s *Store) Materialize(ctx context.Context, id string) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	h := s.pending[id]
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	empty := &batch{seqs: []int64{}, types: []string{}, times: []int64{}, pbs: [][]byte{}}
	if err := s.appendRows(ctx, id, h, empty); err != nil {
		return err
	}
	s.mu.Lock()
	if s.pending[id] == h {
		delete(s.pending, id)
	}
	s.mu.Unlock()
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

// Append durably appends one batch in one transaction (one statement,
// one round trip: see dsh_append in schema.go).
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
	if err := s.appendRows(ctx, id, h, rows); err != nil {
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

// appendRows stores a batch with dsh_append: the fence of a fenced store,
// the sessions row of h (a pending session; nil otherwise), the seq check
// and the rows, in one transaction.
func (s *Store) appendRows(ctx context.Context, id string, h *sessionv1.SessionHeader, b *batch) error {
	var epoch int64
	if s.owner != "" {
		var ok bool
		if epoch, ok = s.heldEpoch(id); !ok {
			return fmt.Errorf("session %q: this replica holds no lease: %w", id, persistence.ErrFenced)
		}
	}
	var (
		header, cwd, parent *string
		version, depth      int32
		createdAt           int64
		seedLength          *int64
	)
	if h != nil {
		hb, err := persistence.MarshalHeader(h)
		if err != nil {
			return fmt.Errorf("session %q: header: %w", id, err)
		}
		hs, c, p := string(hb), h.GetCwd(), h.GetParentSession()
		header, cwd, parent = &hs, &c, &p
		version, depth, createdAt = h.GetVersion(), h.GetDelegationDepth(), h.GetCreatedAt()
		if h.SeedLength != nil {
			v := h.GetSeedLength()
			seedLength = &v
		}
	}
	_, err := s.pool.Exec(ctx, `SELECT dsh_append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
		id, b.first, s.owner, epoch, header, version, createdAt, cwd, parent, seedLength, depth, b.seqs, b.types, b.times, b.pbs)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "DSHFE":
			s.forget(id, epoch)
			return fmt.Errorf("session %q: %s: %w", id, pgErr.Message, persistence.ErrFenced)
		case "DSHEX":
			return fmt.Errorf("session %q: %w", id, persistence.ErrExists)
		case "DSHNF":
			return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
		case "DSHSQ":
			if next, perr := strconv.ParseInt(pgErr.Message, 10, 64); perr == nil {
				return &persistence.SeqError{SessionID: id, Index: 0, Want: next, Got: b.first}
			}
		}
	}
	return fmt.Errorf("session %q: append seqs %d..%d: %w", id, b.first, b.first+int64(len(b.seqs))-1, err)
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
