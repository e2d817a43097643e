// Package sqlitestore is the SQLite session store (the default backend): one
// database file holding every session, on the pure-Go modernc.org/sqlite
// driver, in WAL mode.
//
// Schema: a sessions table (one row per materialised session: header
// columns, the full header, the stored log length and the published cursor)
// and an events table (one row per event: session_id, seq, type, time and the
// event in protobuf binary). PRAGMA user_version carries SchemaVersion; a
// version-1 database (which also kept each event as JSON) is migrated at
// Open; an unknown version is refused, never migrated silently.
//
// # Delivery
//
// Every Append is a savepoint in an IMMEDIATE transaction on the single
// writer connection: it materialises the sessions row of a lazily created
// session, asserts that the batch starts at the stored next seq, inserts the
// rows and advances next_seq; any failure rolls the whole batch back. Appends
// of different sessions that arrive together share one transaction and one
// commit (group commit, commit.go); each returns only after that commit.
// With the default synchronous=FULL the commit fsyncs the WAL, so an Append
// that returned nil
// survives a process crash and a power loss; with Synchronous "NORMAL" it
// survives a process crash only. Load repairs an interrupted turn in its own
// transaction, asserting that the log did not grow meanwhile.
//
// The database file is created 0600 (SQLite gives its -wal and -shm files
// the same mode) in a directory created 0700.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

// rowsPerInsert is the number of event rows one multi-row INSERT carries.
const rowsPerInsert = 16

// Config configures a Store.
type Config struct {
	// Path of the database file; its directory is created 0700 if missing.
	Path string
	// Synchronous is the SQLite synchronous level: "FULL" (default; a
	// committed append survives power loss) or "NORMAL" (it survives a
	// process crash; faster).
	Synchronous string
	// Readers bounds the read connections (Load, List); default 4.
	Readers int
	// Logger; nil discards.
	Logger *slog.Logger
	// OnCommit, when set, is called by the committer after each group
	// commit (metrics); it must not block.
	OnCommit func(CommitStats)
}

// Store is a persistence.Store over one SQLite database.
type Store struct {
	w   *sql.DB // the single writer connection
	r   *sql.DB // read-only connections
	log *slog.Logger

	insertSession, selectNext, insertEvent, insertEvents, updateNext, raiseCursor *sql.Stmt

	mu      sync.Mutex
	closed  bool
	pending map[string]*sessionv1.SessionHeader // created, not yet materialised

	// Group commit (commit.go): writes queue for the committer goroutine.
	gate     sync.RWMutex // held shared while queueing; Close takes it to stop queueing
	gateShut bool
	queue    chan *writeReq
	stop     chan struct{} // closed by Close
	stopped  chan struct{} // closed by the committer when it has drained
	onCommit func(CommitStats)
	waits    []time.Duration // the committer's scratch for CommitStats.Waits
}

var (
	_ persistence.Store     = (*Store)(nil)
	_ persistence.Reader    = (*Store)(nil)
	_ persistence.Discarder = (*Store)(nil)

	_ persistence.ValidatedAppender = (*Store)(nil)
)

func dsn(path, sync string, readOnly bool) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous("+sync+")")
	if readOnly {
		q.Add("_query_only", "1")
	} else {
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_txlock", "immediate")
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// Open opens (creating if needed) the database at cfg.Path and checks its
// schema version.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("sqlitestore: empty path")
	}
	sync := cfg.Synchronous
	switch sync {
	case "":
		sync = "FULL"
	case "FULL", "NORMAL":
	default:
		return nil, fmt.Errorf("sqlitestore: synchronous %q: want FULL or NORMAL", sync)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	// Create the file ourselves so that it is 0600 whatever the umask.
	f, err := os.OpenFile(cfg.Path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	f.Close()

	s := &Store{log: cfg.Logger, pending: make(map[string]*sessionv1.SessionHeader), onCommit: cfg.OnCommit,
		queue: make(chan *writeReq, maxGroup), stop: make(chan struct{}), stopped: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.w, err = sql.Open("sqlite", dsn(cfg.Path, sync, false)); err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if err := s.migrate(ctx); err != nil {
		s.w.Close()
		return nil, err
	}
	if s.r, err = sql.Open("sqlite", dsn(cfg.Path, sync, true)); err != nil {
		s.w.Close()
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	readers := cfg.Readers
	if readers <= 0 {
		readers = 4
	}
	s.r.SetMaxOpenConns(readers)
	s.r.SetMaxIdleConns(readers)
	go s.committer()
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// migrate stamps a fresh database with the schema and refuses an unknown
// version.
func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: %w", err)
	}
	defer tx.Rollback()
	var version, tables int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("sqlitestore: read schema version: %w", err)
	}
	switch version {
	case SchemaVersion:
		return nil
	case 1:
		return s.migrate1to2(ctx, tx)
	case 0:
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&tables); err != nil {
			return fmt.Errorf("sqlitestore: %w", err)
		}
		if tables > 0 {
			return fmt.Errorf("sqlitestore: database has tables but no schema version: %w", persistence.ErrUnknownVersion)
		}
	default:
		return fmt.Errorf("sqlitestore: schema version %d (this build knows %d): %w", version, SchemaVersion, persistence.ErrUnknownVersion)
	}
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("sqlitestore: create schema: %w", err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion)); err != nil {
		return fmt.Errorf("sqlitestore: stamp schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: %w", err)
	}
	return nil
}

func (s *Store) prepare(ctx context.Context) error {
	for _, p := range []struct {
		dst **sql.Stmt
		q   string
	}{
		{&s.insertSession, `INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header, next_seq)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING`},
		{&s.selectNext, `SELECT next_seq FROM sessions WHERE id = ?`},
		{&s.insertEvent, `INSERT INTO events (session_id, seq, type, time, pb) VALUES (?, ?, ?, ?, ?)`},
		{&s.insertEvents, `INSERT INTO events (session_id, seq, type, time, pb) VALUES ` +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?), ", rowsPerInsert), ", ")},
		{&s.updateNext, `UPDATE sessions SET next_seq = ? WHERE id = ?`},
		{&s.raiseCursor, `UPDATE sessions SET published_next = ?2 WHERE id = ?1 AND published_next < ?2 AND ?2 <= next_seq`},
	} {
		st, err := s.w.PrepareContext(ctx, p.q)
		if err != nil {
			return fmt.Errorf("sqlitestore: prepare: %w", err)
		}
		*p.dst = st
	}
	return nil
}

// Ping reads the database file (the agent's health probe): an error means
// the store cannot serve reads.
func (s *Store) Ping(ctx context.Context) error {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&n); err != nil {
		return fmt.Errorf("sqlitestore: ping: %w", err)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.gate.Lock()
	s.gateShut = true
	s.gate.Unlock()
	close(s.stop)
	<-s.stopped // every queued write answered
	var errs []error
	for _, st := range []*sql.Stmt{s.insertSession, s.selectNext, s.insertEvent, s.insertEvents, s.updateNext, s.raiseCursor} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	errs = append(errs, s.w.Close())
	return errors.Join(errs...)
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

// Create registers a session; the sessions row is written by the first
// Append.
func (s *Store) Create(ctx context.Context, h *sessionv1.SessionHeader) error {
	if err := persistence.CheckHeader(h); err != nil {
		return err
	}
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	_, dup := s.pending[h.GetId()]
	s.mu.Unlock()
	if dup {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	var n int64
	err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE id = ?`, h.GetId()).Scan(&n)
	if err != nil {
		return fmt.Errorf("session %q: %w", h.GetId(), err)
	}
	if n > 0 {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.pending[h.GetId()]; dup {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	s.pending[h.GetId()] = proto.CloneOf(h)
	return nil
}

// Append durably appends one batch in one transaction.
func (s *Store) Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error {
	return s.append(ctx, id, events, true)
}

// AppendValidated is Append for events a session.Log committed, which
// applied session.ValidateEvent's rules already (persistence.ValidatedAppender).
func (s *Store) AppendValidated(ctx context.Context, id string, events []*sessionv1.SessionEvent) error {
	return s.append(ctx, id, events, false)
}

func (s *Store) append(ctx context.Context, id string, events []*sessionv1.SessionEvent, validate bool) error {
	if len(events) == 0 {
		return ctx.Err()
	}
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	// Encode outside the transaction (contiguity checked here); the check
	// against the stored next seq is made inside it.
	data, err := encodeRows(id, events[0].GetSeq(), events, validate)
	if err != nil {
		return err
	}
	s.mu.Lock()
	h := s.pending[id]
	s.mu.Unlock()

	var after func()
	if h != nil {
		after = func() {
			s.mu.Lock()
			if s.pending[id] == h {
				delete(s.pending, id)
			}
			s.mu.Unlock()
		}
	}
	return s.submit(ctx, s.appendReq(id, h, events, data), after)
}

func (s *Store) materialize(ctx context.Context, tx *sql.Tx, h *sessionv1.SessionHeader) error {
	hb, err := persistence.MarshalHeader(h)
	if err != nil {
		return fmt.Errorf("session %q: header: %w", h.GetId(), err)
	}
	var seedLength any
	if h.SeedLength != nil {
		seedLength = h.GetSeedLength()
	}
	res, err := tx.StmtContext(ctx, s.insertSession).ExecContext(ctx, h.GetId(), h.GetVersion(), h.GetCreatedAt(),
		h.GetCwd(), h.GetParentSession(), seedLength, h.GetDelegationDepth(), string(hb))
	if err != nil {
		return fmt.Errorf("session %q: %w", h.GetId(), err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("session %q: %w", h.GetId(), err)
	} else if n == 0 {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	return nil
}

// appendRows asserts the stored next seq and inserts the rows.
func (s *Store) appendRows(ctx context.Context, tx *sql.Tx, id string, events []*sessionv1.SessionEvent, data [][]byte) error {
	var next int64
	err := tx.StmtContext(ctx, s.selectNext).QueryRowContext(ctx, id).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	if err := persistence.CheckBatch(id, next, events); err != nil {
		return err
	}
	// Insert rowsPerInsert rows per statement, then the rest one by one:
	// each Exec costs more in database/sql than a row costs in SQLite.
	i := 0
	if len(events) >= rowsPerInsert {
		many := tx.StmtContext(ctx, s.insertEvents)
		args := make([]any, 0, 5*rowsPerInsert)
		for ; i+rowsPerInsert <= len(events); i += rowsPerInsert {
			args = args[:0]
			for j := i; j < i+rowsPerInsert; j++ {
				ev := events[j]
				args = append(args, id, ev.GetSeq(), session.TypeName(ev), ev.GetTime(), data[j])
			}
			if _, err := many.ExecContext(ctx, args...); err != nil {
				return fmt.Errorf("session %q: insert seqs %d..%d: %w", id, events[i].GetSeq(), events[i+rowsPerInsert-1].GetSeq(), err)
			}
		}
	}
	if i < len(events) {
		one := tx.StmtContext(ctx, s.insertEvent)
		for ; i < len(events); i++ {
			ev := events[i]
			if _, err := one.ExecContext(ctx, id, ev.GetSeq(), session.TypeName(ev), ev.GetTime(), data[i]); err != nil {
				return fmt.Errorf("session %q: insert seq %d: %w", id, ev.GetSeq(), err)
			}
		}
	}
	if _, err := tx.StmtContext(ctx, s.updateNext).ExecContext(ctx, next+int64(len(events)), id); err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	return nil
}

var pbMarshal = proto.MarshalOptions{Deterministic: true}

// encodeRows checks a batch (contiguity; with validate, the per-event rules
// of session.ValidateEvent, so that the store never writes an event its Load
// would reject) and encodes each event to its stored form, protobuf binary.
// Events a session.Log committed passed those rules already (AppendValidated
// skips them).
func encodeRows(id string, next int64, events []*sessionv1.SessionEvent, validate bool) ([][]byte, error) {
	if err := persistence.CheckBatch(id, next, events); err != nil {
		return nil, err
	}
	out := make([][]byte, len(events))
	for i, ev := range events {
		typ := session.TypeName(ev)
		if typ == "" {
			return nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: "(none)", Err: errors.New("event has no payload")}
		}
		if validate {
			if err := session.ValidateEvent(ev); err != nil {
				return nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
			}
		}
		pb, err := pbMarshal.Marshal(ev)
		if err != nil {
			return nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
		}
		out[i] = pb
	}
	return out, nil
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
