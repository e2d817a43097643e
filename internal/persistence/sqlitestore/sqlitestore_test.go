package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
)

func dbPath(dir string) string { return filepath.Join(dir, "data", "dsh.db") }

func openAt(ctx context.Context, dir string) (persistence.Store, error) {
	return sqlitestore.Open(ctx, sqlitestore.Config{Path: dbPath(dir)})
}

func TestMain(m *testing.M) {
	persistencetest.MaybeRunCrashChild(openAt)
	os.Exit(m.Run())
}

func open(t testing.TB, dir string) persistence.Store {
	t.Helper()
	s, err := openAt(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	persistencetest.Run(t, func(t *testing.T, dir string) persistence.Store { return open(t, dir) })
}

func TestCrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("short")
	}
	persistencetest.RunCrash(t, openAt, 8*time.Second)
}

func BenchmarkStore(b *testing.B) {
	persistencetest.Bench(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) })
}

// BenchmarkSyncNormal measures appends with synchronous=NORMAL (durable
// against a process crash, not a power loss).
func BenchmarkSyncNormal(b *testing.B) {
	persistencetest.BenchAppend(b, func(b *testing.B, dir string) persistence.Store {
		s, err := sqlitestore.Open(b.Context(), sqlitestore.Config{Path: dbPath(dir), Synchronous: "NORMAL"})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, 1, 100)
}

// stored appends one completed turn to a new session.
func stored(t *testing.T, s persistence.Store, id string) *persistencetest.Builder {
	t.Helper()
	var b persistencetest.Builder
	b.CompletedTurn(2)
	if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), id, b.Events()); err != nil {
		t.Fatal(err)
	}
	return &b
}

func rawDB(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestFileModes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	stored(t, s, "m")
	for path, want := range map[string]os.FileMode{
		filepath.Dir(dbPath(dir)): 0o700 | os.ModeDir,
		dbPath(dir):               0o600,
		dbPath(dir) + "-wal":      0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
}

func TestSchemaVersionRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		sql  string
	}{
		{"future version", "PRAGMA user_version = 7"},
		{"tables without version", "PRAGMA user_version = 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := open(t, dir)
			stored(t, s, "v")
			s.Close()
			if _, err := rawDB(t, dir).Exec(tt.sql); err != nil {
				t.Fatal(err)
			}
			_, err := openAt(t.Context(), dir)
			if !errors.Is(err, persistence.ErrUnknownVersion) {
				t.Fatalf("Open: %v, want ErrUnknownVersion", err)
			}
		})
	}
}

// TestQueryableRows checks that each event is one row with its seq, type and
// time in columns (for queries) and its one encoding, protobuf, in pb; people
// read the events as JSON through the CLI (inspect.Dump).
func TestQueryableRows(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	b := stored(t, s, "r")
	rows, err := rawDB(t, dir).Query(`SELECT seq, type, time, pb FROM events WHERE session_id = 'r' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			seq, tm int64
			typ     string
			pb      []byte
		)
		if err := rows.Scan(&seq, &typ, &tm, &pb); err != nil {
			t.Fatal(err)
		}
		ev := b.Events()[seq]
		var got sessionv1.SessionEvent
		if seq != int64(n) || tm != ev.GetTime() || typ != session.TypeName(ev) || proto.Unmarshal(pb, &got) != nil || !proto.Equal(&got, ev) {
			t.Errorf("row %d: seq %d type %q time %d pb %x", n, seq, typ, tm, pb)
		}
		n++
	}
	if n != int(b.Len()) {
		t.Fatalf("%d rows, want %d", n, b.Len())
	}
	var cols int
	if err := rawDB(t, dir).QueryRow(`SELECT count(*) FROM pragma_table_info('events') WHERE name = 'data'`).Scan(&cols); err != nil || cols != 0 {
		t.Fatalf("events.data still there (%d, %v): one encoding per event", cols, err)
	}
}

// TestFailedAppendRollsBack makes an insert fail in the middle of a batch
// and checks that nothing of the batch stays and a retry succeeds.
func TestFailedAppendRollsBack(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	var b persistencetest.Builder
	for range 4 {
		b.CompletedTurn(6)
	}
	evs := b.Events()
	if err := s.Create(t.Context(), persistencetest.Header("f")); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "f", evs[:5]); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, dir)
	if _, err := db.Exec(`CREATE TRIGGER fail BEFORE INSERT ON events WHEN NEW.seq = 30 BEGIN SELECT RAISE(ABORT, 'injected: disk full'); END`); err != nil {
		t.Fatal(err)
	}
	// 40 rows: two multi-row inserts (the second fails) and the rest.
	if err := s.Append(t.Context(), "f", evs[5:45]); err == nil {
		t.Fatal("Append succeeded through a failing insert")
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE session_id = 'f'`).Scan(&rows); err != nil || rows != 5 {
		t.Fatalf("rows after a failed append = %d (%v), want 5", rows, err)
	}
	if _, err := db.Exec(`DROP TRIGGER fail`); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "f", evs[5:]); err != nil {
		t.Fatalf("retry: %v", err)
	}
	_, got, err := s.Load(t.Context(), "f")
	if err != nil || len(got) != len(evs) {
		t.Fatalf("Load: %d events, %v; want %d", len(got), err, len(evs))
	}
}

// BenchmarkParallelSessions: 16 sessions appending turns of 20 events at
// once, through SQLite's single writer (compare pgstore's).
func BenchmarkParallelSessions(b *testing.B) {
	persistencetest.BenchParallel(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) }, 16, 20)
}

// BenchmarkConcurrentFlush: N sessions flushing small batches (4 events, an
// agent step's flush) at once, with the default synchronous=FULL: group
// commit lets them share transactions and fsyncs.
func BenchmarkConcurrentFlush(b *testing.B) {
	for _, n := range []int{1, 16, 100} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			persistencetest.BenchParallel(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) }, n, 4)
		})
	}
}
