// Package sqlitestore is the SQLite session store (the default backend): one
// database file holding every session, on the pure-Go modernc.org/sqlite
// driver, in WAL mode.
//
// Schema (schema.go): a sessions table (one row per materialised session:
// an integer key, header columns, the full header and the published cursor)
// and a batches table (one row per appended batch: the session's integer
// key, the first seq, the count and the events in framed protobuf binary;
// the log length is the end of the last batch). PRAGMA user_version carries
// SchemaVersion; a version-1 or -2 database (one row per event, keyed by
// the text id) is migrated at Open; an unknown version is refused, never
// migrated silently.
//
// # Delivery
//
// Every Append is one request of a group committed in an IMMEDIATE
// transaction on the single writer connection (commit.go; a group runs
// without savepoints and is re-run with one per request when a statement
// fails): it materialises the sessions row of a lazily created
// session, asserts that the batch starts at the stored next seq and inserts
// the batch's rows; any failure rolls the whole batch back. Appends
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
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

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

	insertSession, lookupSession, insertBatch, raiseCursor *sql.Stmt

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
	_ persistence.EncodingAppender  = (*Store)(nil)
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

// migrate stamps a fresh database with the schema, migrates an older one
// (1 to 2 to 3, in one transaction: a failed step leaves the database as it
// was) and refuses an unknown version.
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
	case 1, 2:
		if version == 1 {
			if err := s.migrate1to2(ctx, tx); err != nil {
				return err
			}
		}
		if err := s.migrate2to3(ctx, tx, version); err != nil {
			return err
		}
	case 0:
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&tables); err != nil {
			return fmt.Errorf("sqlitestore: %w", err)
		}
		if tables > 0 {
			return fmt.Errorf("sqlitestore: database has tables but no schema version: %w", persistence.ErrUnknownVersion)
		}
		if _, err := tx.ExecContext(ctx, schema); err != nil {
			return fmt.Errorf("sqlitestore: create schema: %w", err)
		}
	default:
		return fmt.Errorf("sqlitestore: schema version %d (this build knows %d): %w", version, SchemaVersion, persistence.ErrUnknownVersion)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion)); err != nil {
		return fmt.Errorf("sqlitestore: stamp schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: %w", err)
	}
	if version != 0 {
		s.log.Info("sqlitestore: migrated the database", "from", version, "to", SchemaVersion)
	}
	return nil
}

func (s *Store) prepare(ctx context.Context) error {
	for _, p := range []struct {
		dst **sql.Stmt
		q   string
	}{
		{&s.insertSession, `INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`},
		{&s.lookupSession, `SELECT sid, ` + nextSeqOf("sessions.sid") + ` FROM sessions WHERE id = ?`},
		{&s.insertBatch, insertBatchSQL},
		{&s.raiseCursor, `UPDATE sessions SET published_next = ?2 WHERE id = ?1 AND published_next < ?2 AND ?2 <= ` + nextSeqOf("sessions.sid")},
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
	for _, st := range []*sql.Stmt{s.insertSession, s.lookupSession, s.insertBatch, s.raiseCursor} {
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
	_, err := s.append(ctx, id, events, true)
	return err
}

// AppendValidated is Append for events a session.Log committed, which
// applied session.ValidateEvent's rules already (persistence.ValidatedAppender).
func (s *Store) AppendValidated(ctx context.Context, id string, events []*sessionv1.SessionEvent) error {
	_, err := s.append(ctx, id, events, false)
	return err
}

// AppendEncoded is AppendValidated that also returns each event's stored
// protobuf encoding (persistence.EncodingAppender): the agent's event
// fan-out publishes those bytes instead of marshalling every event again.
func (s *Store) AppendEncoded(ctx context.Context, id string, events []*sessionv1.SessionEvent) ([][]byte, error) {
	return s.append(ctx, id, events, false)
}

// append stores a batch and returns the events' encodings (shared with no
// one: the rows are framed copies).
func (s *Store) append(ctx context.Context, id string, events []*sessionv1.SessionEvent, validate bool) ([][]byte, error) {
	if len(events) == 0 {
		return nil, ctx.Err()
	}
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	// Encode outside the transaction (contiguity checked here); the check
	// against the stored next seq is made inside it.
	data, err := encodeRows(id, events[0].GetSeq(), events, validate)
	if err != nil {
		return nil, err
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
	if err := s.submit(ctx, s.appendReq(id, h, events, packRows(events[0].GetSeq(), data)), after); err != nil {
		return nil, err
	}
	return data, nil
}

// materialize inserts the sessions row of a pending session and returns
// its sid; an existing row is ErrExists (nothing written).
func (s *Store) materialize(ctx context.Context, tx *sql.Tx, h *sessionv1.SessionHeader) (int64, error) {
	hb, err := persistence.MarshalHeader(h)
	if err != nil {
		return 0, fmt.Errorf("session %q: header: %w", h.GetId(), err)
	}
	var seedLength any
	if h.SeedLength != nil {
		seedLength = h.GetSeedLength()
	}
	res, err := tx.StmtContext(ctx, s.insertSession).ExecContext(ctx, h.GetId(), h.GetVersion(), h.GetCreatedAt(),
		h.GetCwd(), h.GetParentSession(), seedLength, h.GetDelegationDepth(), string(hb))
	if err != nil {
		return 0, dirty(fmt.Errorf("session %q: %w", h.GetId(), err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, dirty(fmt.Errorf("session %q: %w", h.GetId(), err))
	}
	if n == 0 {
		return 0, fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	sid, err := res.LastInsertId()
	if err != nil {
		return 0, dirty(fmt.Errorf("session %q: %w", h.GetId(), err))
	}
	return sid, nil
}

// lookup returns a stored session's sid and log length; a missing session
// is ErrNotFound.
func (s *Store) lookup(ctx context.Context, tx *sql.Tx, id string) (sid, next int64, err error) {
	err = tx.StmtContext(ctx, s.lookupSession).QueryRowContext(ctx, id).Scan(&sid, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return 0, 0, dirty(fmt.Errorf("session %q: %w", id, err))
	}
	return sid, next, nil
}

// insertRows inserts a checked batch's rows (a failure is a *dirtyError:
// earlier rows, or the materialised session, may be written).
func (s *Store) insertRows(ctx context.Context, tx *sql.Tx, id string, sid int64, rows []batchRow) error {
	st := tx.StmtContext(ctx, s.insertBatch)
	for _, r := range rows {
		if _, err := st.ExecContext(ctx, sid, r.seq, r.n, r.pb); err != nil {
			return dirty(fmt.Errorf("session %q: insert seqs %d..%d: %w", id, r.seq, r.seq+int64(r.n)-1, err))
		}
	}
	return nil
}

var (
	pbMarshal = proto.MarshalOptions{Deterministic: true}
	// pbMarshalSized marshals a message whose proto.Size was just taken
	// (the sizes of its parts are reused, not computed again).
	pbMarshalSized = proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
)

// encodeRows checks a batch (contiguity; with validate, the per-event rules
// of session.ValidateEvent, so that the store never writes an event its Load
// would reject) and encodes each event to its stored form, protobuf binary.
// Events a session.Log committed passed those rules already (AppendValidated
// skips them). The encodings share one buffer (one allocation per batch);
// each is capped at its own end.
func encodeRows(id string, next int64, events []*sessionv1.SessionEvent, validate bool) ([][]byte, error) {
	if err := persistence.CheckBatch(id, next, events); err != nil {
		return nil, err
	}
	total := 0
	for _, ev := range events {
		typ := session.TypeName(ev)
		if typ == "" {
			return nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: "(none)", Err: errors.New("event has no payload")}
		}
		if validate {
			if err := session.ValidateEvent(ev); err != nil {
				return nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
			}
		}
		total += proto.Size(ev)
	}
	out := make([][]byte, len(events))
	buf := make([]byte, 0, total)
	for i, ev := range events {
		start := len(buf)
		var err error
		if buf, err = pbMarshalSized.MarshalAppend(buf, ev); err != nil {
			return nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: session.TypeName(ev), Err: err}
		}
		out[i] = buf[start:len(buf):len(buf)]
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
