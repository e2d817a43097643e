// Package jsonlstore is the JSON Lines session store: one file per session
// under a root directory, a header record on line 1 and one event per line
// after it, so a person can read a log with any text tool.
//
// Layout: <root>/<encoded id>.jsonl holds the log and <root>/<encoded
// id>.cursor the published cursor; EncodeID makes any id a safe, injective
// file name. Files are 0600, a root the store creates is 0700, and a lock
// file (<root>/~lock, flock) keeps a second process from opening the same
// root.
//
// # Delivery
//
// Create writes nothing. The first Append writes the header and the batch to
// a temporary file, fsyncs it, and publishes it with a hard link (which
// fails instead of overwriting a same-id file) and a directory fsync. Later
// Appends write the batch at the end of the file and fsync; a failed write or
// fsync truncates the file back to its previous length. An Append returns
// nil only after its fsync.
//
// Load treats a final line without '\n' and, after the last committed
// turn/end, the first unreadable line and everything after it as a torn tail:
// it truncates them and durably appends the closers of an interrupted turn.
// An unreadable line at or before the last turn/end is corruption, refused
// with its line number.
package jsonlstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

const (
	logSuffix    = ".jsonl"
	cursorSuffix = ".cursor"
	tmpPrefix    = "~tmp-" // never produced by EncodeID ('t' is not hex)
	lockName     = "~lock"
)

// Config configures a Store.
type Config struct {
	// Root is the directory holding the session files; created 0700 if
	// missing. Required.
	Root string
	// Logger receives warnings (unreadable files skipped by List). Nil
	// discards them.
	Logger *slog.Logger
	// ReadOnly opens the root without its lock, for inspection next to a
	// running owner: only List, ReadHeader, ReadEvents, PublishedCursor and
	// CheckStorage work; the other methods fail with ErrReadOnly.
	ReadOnly bool
	// LockTimeout bounds the wait for the root's lock (default 2s). A lock
	// held by a live process is refused after it; the wait absorbs a lock
	// that a previous owner is releasing, or that a child process forked at
	// the wrong moment briefly shares.
	LockTimeout time.Duration
}

// ErrReadOnly is returned by the mutating methods of a store opened with
// Config.ReadOnly.
var ErrReadOnly = errors.New("jsonlstore: store opened read-only")

// Store is a persistence.Store over JSONL files.
type Store struct {
	root     string
	log      *slog.Logger
	lock     *os.File // nil when read-only
	readOnly bool
	// write writes a batch at an offset and fsyncs (writeAt; tests inject
	// failures here).
	write func(path string, off int64, b []byte) error

	mu       sync.Mutex
	closed   bool
	pending  map[string]*sessionv1.SessionHeader // created, not yet materialised
	sessions map[string]*sess
}

var (
	_ persistence.Store     = (*Store)(nil)
	_ persistence.Reader    = (*Store)(nil)
	_ persistence.Discarder = (*Store)(nil)
)

// sess is the per-session state; mu serialises the session's operations.
type sess struct {
	mu    sync.Mutex
	known bool  // size and next are valid
	size  int64 // committed file length
	next  int64 // stored log length
}

// Open opens (creating if needed) the store rooted at cfg.Root.
func Open(cfg Config) (*Store, error) {
	if cfg.Root == "" {
		return nil, errors.New("jsonlstore: empty root")
	}
	var lock *os.File
	if cfg.ReadOnly {
		if fi, err := os.Stat(cfg.Root); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("jsonlstore: root %s: not a directory (%v)", cfg.Root, err)
		}
	} else {
		if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
			return nil, fmt.Errorf("jsonlstore: %w", err)
		}
		var err error
		lock, err = os.OpenFile(filepath.Join(cfg.Root, lockName), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("jsonlstore: %w", err)
		}
		if err := flock(lock, cmp.Or(cfg.LockTimeout, 2*time.Second)); err != nil {
			lock.Close()
			return nil, fmt.Errorf("jsonlstore: root %s is in use by another process: %w", cfg.Root, err)
		}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{
		root:     cfg.Root,
		log:      logger,
		lock:     lock,
		readOnly: cfg.ReadOnly,
		write:    writeAt,
		pending:  make(map[string]*sessionv1.SessionHeader),
		sessions: make(map[string]*sess),
	}, nil
}

// flock takes an exclusive lock on f, polling until timeout.
func flock(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil || !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Ping checks that the root is still a readable directory (the agent's
// health probe).
func (s *Store) Ping(context.Context) error {
	fi, err := os.Stat(s.root)
	if err == nil && !fi.IsDir() {
		err = fmt.Errorf("%s is not a directory", s.root)
	}
	if err != nil {
		return fmt.Errorf("jsonlstore: ping: %w", err)
	}
	return nil
}

// Close releases the root lock. Pending sessions are forgotten.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.lock == nil {
		return nil
	}
	return s.lock.Close() // closing the descriptor releases the flock
}

// Path returns the file that holds (or will hold) a session's log.
func (s *Store) Path(id string) (string, error) {
	name, err := EncodeID(id)
	if err != nil {
		return "", fmt.Errorf("%w: %v", persistence.ErrInvalidHeader, err)
	}
	return filepath.Join(s.root, name+logSuffix), nil
}

// acquire returns the locked state of a session; the caller unlocks it.
func (s *Store) acquire(ctx context.Context, id string) (*sess, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	name, err := EncodeID(id)
	if err != nil {
		return nil, "", fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, "", persistence.ErrClosed
	}
	st := s.sessions[id]
	if st == nil {
		st = &sess{}
		s.sessions[id] = st
	}
	s.mu.Unlock()
	st.mu.Lock()
	return st, name, nil
}

// Create registers a session; it writes nothing until the first Append.
func (s *Store) Create(ctx context.Context, h *sessionv1.SessionHeader) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.readOnly {
		return ErrReadOnly
	}
	if err := persistence.CheckHeader(h); err != nil {
		return err
	}
	name, err := EncodeID(h.GetId())
	if err != nil {
		return fmt.Errorf("%w: %v", persistence.ErrInvalidHeader, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return persistence.ErrClosed
	}
	if _, ok := s.pending[h.GetId()]; ok {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	}
	if _, err := os.Lstat(filepath.Join(s.root, name+logSuffix)); err == nil {
		return fmt.Errorf("session %q: %w", h.GetId(), persistence.ErrExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("session %q: %w", h.GetId(), err)
	}
	s.pending[h.GetId()] = proto.CloneOf(h)
	return nil
}

// Append durably appends one batch.
func (s *Store) Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error {
	if len(events) == 0 {
		return ctx.Err()
	}
	if s.readOnly {
		return ErrReadOnly
	}
	st, name, err := s.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer st.mu.Unlock()
	path := filepath.Join(s.root, name+logSuffix)

	if !st.known {
		s.mu.Lock()
		h := s.pending[id]
		s.mu.Unlock()
		if h != nil {
			return s.materialize(st, id, path, h, events)
		}
		if err := s.adopt(st, id, path); err != nil {
			return err
		}
	}

	lines, err := persistence.EncodeBatch(id, st.next, events)
	if err != nil {
		return err
	}
	if err := s.write(path, st.size, joinLines(nil, lines)); err != nil {
		return s.rollback(st, id, path, err)
	}
	st.size += int64(lenLines(lines))
	st.next += int64(len(events))
	return nil
}

// materialize publishes a new session file holding the header and the first
// batch, without overwriting an existing file.
func (s *Store) materialize(st *sess, id, path string, h *sessionv1.SessionHeader, events []*sessionv1.SessionEvent) error {
	lines, err := persistence.EncodeBatch(id, 0, events)
	if err != nil {
		return err
	}
	hl, err := encodeHeaderLine(h)
	if err != nil {
		return fmt.Errorf("session %q: header: %w", id, err)
	}
	buf := joinLines(hl, lines)
	tmp, err := os.CreateTemp(s.root, tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(buf)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("session %q: write: %w", id, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("session %q: %w", id, persistence.ErrExists)
		}
		return fmt.Errorf("session %q: %w", id, err)
	}
	if err := syncDir(s.root); err != nil {
		// The link may not be durable: remove it so the caller's retry
		// starts over, and report the failure.
		os.Remove(path)
		return fmt.Errorf("session %q: sync directory: %w", id, err)
	}
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
	st.known, st.size, st.next = true, int64(len(buf)), int64(len(events))
	return nil
}

// adopt reads a stored session this process has not loaded: it learns the
// log length and truncates a torn tail. It does not repair an open turn (the
// caller is presumably continuing it).
func (s *Store) adopt(st *sess, id, path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	sc, err := scan(id, data)
	if err != nil {
		return err
	}
	if sc.torn {
		if err := truncate(path, sc.valid); err != nil {
			return fmt.Errorf("session %q: truncate torn tail: %w", id, err)
		}
	}
	st.known, st.size, st.next = true, sc.valid, int64(len(sc.events))
	return nil
}

// rollback truncates the file back to the committed length after a failed
// write and returns the write error.
func (s *Store) rollback(st *sess, id, path string, werr error) error {
	if err := truncate(path, st.size); err != nil {
		st.known = false // re-read the file before the next operation
		s.log.Error("jsonlstore: rollback after a failed append failed", "session", id, "error", err)
	}
	return fmt.Errorf("session %q: append: %w", id, werr)
}

// Load reads, validates and repairs a session.
func (s *Store) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	if s.readOnly {
		return nil, nil, ErrReadOnly
	}
	st, name, err := s.acquire(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	defer st.mu.Unlock()
	path := filepath.Join(s.root, name+logSuffix)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("session %q: %w", id, err)
	}
	sc, err := scan(id, data)
	if err != nil {
		return nil, nil, err
	}
	closers, err := persistence.ValidateLoaded(id, sc.events)
	if err != nil {
		var ce *persistence.CorruptError
		if errors.As(err, &ce) && ce.Seq >= 0 {
			ce.Line = int(ce.Seq) + 2 // line 1 is the header
		}
		return nil, nil, err
	}
	if sc.torn {
		if err := truncate(path, sc.valid); err != nil {
			return nil, nil, fmt.Errorf("session %q: truncate torn tail: %w", id, err)
		}
	}
	st.known, st.size, st.next = true, sc.valid, int64(len(sc.events))
	events := sc.events
	if len(closers) > 0 {
		lines, err := persistence.EncodeBatch(id, st.next, closers)
		if err != nil {
			return nil, nil, fmt.Errorf("session %q: repair: %w", id, err)
		}
		if err := s.write(path, st.size, joinLines(nil, lines)); err != nil {
			return nil, nil, s.rollback(st, id, path, fmt.Errorf("repair: %w", err))
		}
		st.size += int64(lenLines(lines))
		st.next += int64(len(closers))
		events = append(events, closers...)
	}
	return sc.header, events, nil
}

// List reads the header line of every session file.
func (s *Store) List(ctx context.Context) ([]*sessionv1.SessionHeader, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, persistence.ErrClosed
	}
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("jsonlstore: %w", err)
	}
	var out []*sessionv1.SessionHeader
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), logSuffix)
		if !ok || !e.Type().IsRegular() || strings.HasPrefix(base, tmpPrefix) {
			continue
		}
		id, err := DecodeID(base)
		if err != nil {
			s.log.Warn("jsonlstore: skipping a file that is not a session log", "file", e.Name(), "error", err)
			continue
		}
		h, err := readHeader(id, filepath.Join(s.root, e.Name()))
		if err != nil {
			s.log.Warn("jsonlstore: skipping an unreadable session", "session", id, "error", err)
			continue
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b *sessionv1.SessionHeader) int {
		if a.GetCreatedAt() != b.GetCreatedAt() {
			return int(min(max(a.GetCreatedAt()-b.GetCreatedAt(), -1), 1))
		}
		return strings.Compare(a.GetId(), b.GetId())
	})
	return out, nil
}

// PublishedCursor returns the next seq not yet published.
func (s *Store) PublishedCursor(ctx context.Context, id string) (int64, error) {
	st, name, err := s.acquire(ctx, id)
	if err != nil {
		return 0, err
	}
	defer st.mu.Unlock()
	if !st.known {
		if _, err := os.Stat(filepath.Join(s.root, name+logSuffix)); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
			}
			return 0, fmt.Errorf("session %q: %w", id, err)
		}
	}
	return readCursor(id, filepath.Join(s.root, name+cursorSuffix))
}

// SetPublishedCursor raises the published cursor.
func (s *Store) SetPublishedCursor(ctx context.Context, id string, next int64) error {
	if s.readOnly {
		return ErrReadOnly
	}
	st, name, err := s.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer st.mu.Unlock()
	if !st.known {
		if err := s.adopt(st, id, filepath.Join(s.root, name+logSuffix)); err != nil {
			return err
		}
	}
	if next > st.next {
		return &persistence.CursorError{SessionID: id, Next: next, Len: st.next}
	}
	path := filepath.Join(s.root, name+cursorSuffix)
	cur, err := readCursor(id, path)
	if err != nil {
		return err
	}
	if next <= cur {
		return nil
	}
	return writeFileAtomic(s.root, path, strconv.AppendInt(nil, next, 10))
}

// readStored reads and scans a session file without changing it.
func (s *Store) readStored(ctx context.Context, id string) (*scanned, error) {
	st, name, err := s.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	defer st.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(s.root, name+logSuffix))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	return scan(id, data)
}

// ReadHeader returns a stored session's header (line 1 only).
func (s *Store) ReadHeader(ctx context.Context, id string) (*sessionv1.SessionHeader, error) {
	st, name, err := s.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	defer st.mu.Unlock()
	h, err := readHeader(id, filepath.Join(s.root, name+logSuffix))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	return h, err
}

// ReadEvents returns the stored events with seq >= from, without repair; a
// torn tail is left out and left in place.
func (s *Store) ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error) {
	sc, err := s.readStored(ctx, id)
	if err != nil {
		return nil, err
	}
	from = min(max(from, 0), int64(len(sc.events)))
	return sc.events[from:], nil
}

// CheckStorage reports a torn tail that the next Load will truncate
// (inspect.Verify calls it).
func (s *Store) CheckStorage(ctx context.Context, id string) error {
	sc, err := s.readStored(ctx, id)
	if err != nil {
		return err
	}
	if sc.torn {
		return fmt.Errorf("torn tail after line %d (byte %d): the next Load truncates it", len(sc.events)+1, sc.valid)
	}
	return nil
}

// Discard forgets a created but never appended session and the cached state
// of a stored one (the small per-session lock entry stays: another caller
// may be waiting on it).
func (s *Store) Discard(ctx context.Context, id string) error {
	st, _, err := s.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer st.mu.Unlock()
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
	st.known = false
	return nil
}
