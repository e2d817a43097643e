// Package sqlitestore is the SQLite session store (the default backend): one
// database file holding every session, on the pure-Go modernc.org/sqlite
// driver, in WAL mode.
//
// Schema (schema.go): a sessions table (one row per materialised session:
// an integer key, header columns and the full header), a cursors table (the
// published cursor of each session that published anything) and a batches
// table (one row per appended batch: the session's integer
// key, the first seq, the count and the events in framed protobuf binary;
// the log length is the end of the last batch). PRAGMA user_version carries
// SchemaVersion; a version-1, -2 (one row per event, keyed by the text id)
// or -3 (the cursor a sessions column) database is migrated at Open; an
// unknown version is refused, never migrated silently.
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

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

// MaxCommitDelay bounds Config.CommitDelay: a longer hold would add more
// latency to every busy session's flush than the larger groups save.
const MaxCommitDelay = 100 * time.Millisecond

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
	// CommitDelay, when positive, is how long at most the committer holds
	// a group open for more writes while the store is busy (at least two
	// sessions appending, appends arriving at least twice per CommitDelay):
	// fewer, larger commits for many sessions, at most CommitDelay more
	// latency per write for them; a lone session is not held. 0 commits
	// every group at once. See commit.go.
	CommitDelay time.Duration
}

// Store is a persistence.Store over one SQLite database.
type Store struct {
	w   *writer // the single writer connection, the committer's
	r   *sql.DB // read-only connections
	log *slog.Logger

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

	// The committer's own state (commit.go).
	positions   map[string]position // where stored sessions' logs end, as of the last commit
	dataVersion int64               // the writer's PRAGMA data_version when positions was right
	group       groupTx             // the group being committed (reused)
	commitDelay time.Duration       // Config.CommitDelay
	arrivals    arrivals            // the appends' arrival rate, for the commit delay
	holdTimer   *time.Timer         // the commit delay's timer (reused)
	holdHook    func()              // tests: called when a hold begins
	closing     chan struct{}       // closed when Close begins: ends a hold
	results     []error             // scratch for the group's results
	waits       []time.Duration     // scratch for CommitStats.Waits
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
	if cfg.CommitDelay < 0 || cfg.CommitDelay > MaxCommitDelay {
		return nil, fmt.Errorf("sqlitestore: commit delay %v: want 0 (commit at once) to %v", cfg.CommitDelay, MaxCommitDelay)
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

	s := &Store{log: cfg.Logger, pending: make(map[string]*sessionv1.SessionHeader), onCommit: cfg.OnCommit, commitDelay: cfg.CommitDelay,
		queue: make(chan *writeReq, maxGroup), stop: make(chan struct{}), closing: make(chan struct{}), stopped: make(chan struct{}),
		positions: make(map[string]position), group: groupTx{staged: make(map[string]position)}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	// database/sql for the migration (rare, many statements), then the
	// committer's own driver connection (writer.go), opened before the
	// migration's connection closes: closing the last connection of a WAL
	// database checkpoints it and deletes the WAL, which the first commit
	// would then create again — two fsyncs at the open and two more in
	// the first flush, on the path to a new session's first model request
	// (docs/arch/throughput.md §17).
	mdb, err := sql.Open("sqlite", dsn(cfg.Path, sync, false))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	mdb.SetMaxOpenConns(1)
	if err = s.migrate(ctx, mdb); err == nil {
		if s.w, err = openWriter(mdb.Driver(), dsn(cfg.Path, sync, false)); err != nil {
			err = fmt.Errorf("sqlitestore: %w", err)
		}
	}
	if cerr := mdb.Close(); err == nil && cerr != nil {
		s.w.close()
		err = fmt.Errorf("sqlitestore: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	if s.r, err = sql.Open("sqlite", dsn(cfg.Path, sync, true)); err != nil {
		s.w.close()
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	readers := cfg.Readers
	if readers <= 0 {
		readers = 4
	}
	s.r.SetMaxOpenConns(readers)
	s.r.SetMaxIdleConns(readers)
	go s.committer()
	return s, nil
}

// migrate stamps a fresh database with the schema, migrates an older one
// (1 to 2 to 3 to 4, in one transaction: a failed step leaves the database as it
// was) and refuses an unknown version.
func (s *Store) migrate(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
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
	case 1, 2, 3:
		if version == 1 {
			if err := s.migrate1to2(ctx, tx); err != nil {
				return err
			}
		}
		if version <= 2 {
			if err := s.migrate2to3(ctx, tx, version); err != nil {
				return err
			}
		}
		if err := s.migrate3to4(ctx, tx, version); err != nil {
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
	// A hold ends at once; the committer then commits what it has and
	// drains the queue as always.
	close(s.closing)
	s.gate.Lock()
	s.gateShut = true
	s.gate.Unlock()
	close(s.stop)
	<-s.stopped // every queued write answered
	return errors.Join(s.r.Close(), s.w.close())
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

// append stores a batch and returns the events' encodings: each is the
// payload of its frame in a batch row, capped at its own end; the store
// keeps no reference to the rows once committed.
func (s *Store) append(ctx context.Context, id string, events []*sessionv1.SessionEvent, validate bool) ([][]byte, error) {
	if len(events) == 0 {
		return nil, ctx.Err()
	}
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	// Encode outside the transaction (contiguity checked here); the check
	// against the stored next seq is made inside it.
	rows, pb, err := encodeBatchPB(id, events, validate)
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
	if err := s.submit(ctx, id, s.appendReq(id, h, events, rows), after); err != nil {
		return nil, err
	}
	return pb, nil
}

// materialize inserts the sessions row of a pending session and returns
// its sid; an existing row is ErrExists (nothing written).
func (g *groupTx) materialize(h *sessionv1.SessionHeader) (int64, error) {
	hb, err := persistence.MarshalHeader(h)
	if err != nil {
		return 0, fmt.Errorf("session %q: header: %w", h.GetId(), err)
	}
	var seedLength any
	if h.SeedLength != nil {
		seedLength = h.GetSeedLength()
	}
	res, err := g.w.exec(g.w.insertSession, g.w.bind(h.GetId(), int64(h.GetVersion()), h.GetCreatedAt(),
		h.GetCwd(), h.GetParentSession(), seedLength, int64(h.GetDelegationDepth()), string(hb)))
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

var (
	pbMarshal = proto.MarshalOptions{Deterministic: true}
	// pbCached marshals an event whose Size was just taken (encodeBatch).
	pbCached = proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
)

// encodeBatch checks a batch (contiguity from its first seq; with validate,
// the per-event rules of session.ValidateEvent, so that the store never
// writes an event its Load would reject) and encodes it to its stored
// form: batch rows of the events in protobuf binary, framed (frame.go).
// Events a session.Log committed passed those rules already
// (AppendValidated skips them). Each event is marshalled once, straight
// into its row (its size taken first).
func encodeBatch(id string, events []*sessionv1.SessionEvent, validate bool) ([]batchRow, error) {
	rows, _, err := encodeBatchPB(id, events, validate)
	return rows, err
}

// encodeBatchPB is encodeBatch that also returns each event's encoding: the
// payload of its frame, capped at its own end.
func encodeBatchPB(id string, events []*sessionv1.SessionEvent, validate bool) ([]batchRow, [][]byte, error) {
	first := events[0].GetSeq()
	if err := persistence.CheckBatch(id, first, events); err != nil {
		return nil, nil, err
	}
	sizes := make([]int, len(events))
	for i, ev := range events {
		typ := session.TypeName(ev)
		if typ == "" {
			return nil, nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: "(none)", Err: errors.New("event has no payload")}
		}
		if validate {
			if err := session.ValidateEvent(ev); err != nil {
				return nil, nil, &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
			}
		}
		sizes[i] = pbMarshal.Size(ev)
	}
	var (
		rows []batchRow
		out  = make([][]byte, len(events))
		err  error
	)
	splitRows(len(events), func(k int) int { return sizes[k] }, func(i, j, framed int) {
		pb := make([]byte, 0, framed)
		for k := i; k < j && err == nil; k++ {
			pb = protowire.AppendTag(pb, 1, protowire.BytesType)
			pb = protowire.AppendVarint(pb, uint64(sizes[k]))
			at := len(pb)
			if pb, err = pbCached.MarshalAppend(pb, events[k]); err == nil && len(pb)-at != sizes[k] {
				err = fmt.Errorf("encoded in %d bytes, sized %d (changed while stored?)", len(pb)-at, sizes[k])
			}
			out[k] = pb[at:len(pb):len(pb)]
			if err != nil {
				ev := events[k]
				err = &persistence.InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: session.TypeName(ev), Err: err}
			}
		}
		rows = append(rows, batchRow{seq: first + int64(i), n: j - i, pb: pb})
	})
	if err != nil {
		return nil, nil, err
	}
	return rows, out, nil
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
