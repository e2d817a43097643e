package sqlitestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
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

// TestOpenKeepsTheWAL: Open closes its migration connection only after the
// committer's is open, so the fresh database's WAL (holding the schema) is
// still there and the first commit appends to it instead of creating it
// again (a checkpoint, a deleted WAL and two more fsyncs on the way to a new
// session's first model request).
func TestOpenKeepsTheWAL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	fi, err := os.Stat(dbPath(dir) + "-wal")
	if err != nil {
		t.Fatalf("no WAL after Open: %v", err)
	}
	if fi.Size() == 0 {
		t.Fatal("the WAL is empty after Open: the migration's connection checkpointed it")
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

// TestBatchRows checks the stored form: each Append is one batches row
// (session's integer key, first seq, count) holding the events as framed
// protobuf — a message whose field 1 repeats the SessionEvent — and a batch
// larger than a row's bound is split; the log length is derived, not
// stored; there is no events table (and so no second copy of an event).
func TestBatchRows(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	var b persistencetest.Builder
	b.CompletedTurn(2)
	first := b.Len()
	b.StartTurn("big")
	b.StartStep()
	b.Chunks(3, strings.Repeat("x", 40<<10)) // one row each: 2 × 40 KiB > 64 KiB
	b.AssistantMessage("done")
	b.EndStep()
	b.EndTurn()
	if err := s.Create(t.Context(), persistencetest.Header("r")); err != nil {
		t.Fatal(err)
	}
	for _, batch := range [][]*sessionv1.SessionEvent{b.Events()[:first], b.Events()[first:]} {
		if err := s.Append(t.Context(), "r", batch); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := rawDB(t, dir).Query(`SELECT b.seq, b.n, b.pb FROM batches b JOIN sessions s USING (sid) WHERE s.id = 'r' ORDER BY b.seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var (
		starts []int64
		next   int64
	)
	for rows.Next() {
		var (
			seq, n int64
			pb     []byte
		)
		if err := rows.Scan(&seq, &n, &pb); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, seq)
		for k := range n {
			num, typ, m := protowire.ConsumeTag(pb)
			if m < 0 || num != 1 || typ != protowire.BytesType {
				t.Fatalf("row %d: frame %d: tag %d/%d (%d)", seq, k, num, typ, m)
			}
			evb, m2 := protowire.ConsumeBytes(pb[m:])
			if m2 < 0 {
				t.Fatalf("row %d: frame %d: %v", seq, k, protowire.ParseError(m2))
			}
			pb = pb[m+m2:]
			var got sessionv1.SessionEvent
			if err := proto.Unmarshal(evb, &got); err != nil || !proto.Equal(&got, b.Events()[seq+k]) {
				t.Fatalf("row %d frame %d = %v (%v), want %v", seq, k, &got, err, b.Events()[seq+k])
			}
		}
		if len(pb) != 0 {
			t.Fatalf("row %d: %d bytes after its %d events", seq, len(pb), n)
		}
		next = seq + n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The first append is one row; the second splits before each 40 KiB
	// chunk after the first: [first .. first+2] (turn/start, user message,
	// step/start, request header and the first chunk fit 64 KiB), then one
	// row per remaining big chunk, the last with the small tail.
	want := []int64{0, first, first + 5, first + 6}
	if !slices.Equal(starts, want) || next != b.Len() {
		t.Fatalf("rows start at %v up to %d, want %v up to %d", starts, next, want, b.Len())
	}
	if n, err := s.(*sqlitestore.Store).StoredLength(t.Context(), "r"); err != nil || n != b.Len() {
		t.Fatalf("StoredLength = %d, %v; want %d", n, err, b.Len())
	}
	for table, col := range map[string]string{"events": "", "sessions": "next_seq"} {
		var n int
		q := `SELECT count(*) FROM sqlite_schema WHERE name = ?`
		args := []any{table}
		if col != "" {
			q, args = `SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`, []any{table, col}
		}
		if err := rawDB(t, dir).QueryRow(q, args...).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s %s still there (%d, %v)", table, col, n, err)
		}
	}
}

// TestAppendEncodedReturnsTheStoredBytes: AppendEncoded stores like
// AppendValidated and returns each event's protobuf encoding, exactly the
// bytes framed in its batch row, each capped at its own end (appending to
// one cannot overwrite the next); a failed append returns none.
func TestAppendEncodedReturnsTheStoredBytes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	var b persistencetest.Builder
	b.CompletedTurn(3)
	if err := s.Create(t.Context(), persistencetest.Header("e")); err != nil {
		t.Fatal(err)
	}
	st := s.(persistence.EncodingAppender)
	pb, err := st.AppendEncoded(t.Context(), "e", b.Events())
	if err != nil {
		t.Fatal(err)
	}
	if len(pb) != int(b.Len()) {
		t.Fatalf("%d encodings for %d events", len(pb), b.Len())
	}
	var row []byte
	if err := rawDB(t, dir).QueryRow(`SELECT pb FROM batches`).Scan(&row); err != nil {
		t.Fatal(err)
	}
	for i, ev := range b.Events() {
		var got sessionv1.SessionEvent
		if err := proto.Unmarshal(pb[i], &got); err != nil || !proto.Equal(&got, ev) {
			t.Fatalf("encoding %d = %v (%v), want %v", i, &got, err, ev)
		}
		if cap(pb[i]) != len(pb[i]) {
			t.Fatalf("encoding %d: cap %d > len %d", i, cap(pb[i]), len(pb[i]))
		}
		num, _, m := protowire.ConsumeTag(row)
		frame, m2 := protowire.ConsumeBytes(row[m:])
		if num != 1 || m2 < 0 || !bytes.Equal(frame, pb[i]) {
			t.Fatalf("encoding %d differs from the stored frame", i)
		}
		row = row[m+m2:]
	}
	if pb, err := st.AppendEncoded(t.Context(), "e", b.Events()[:1]); err == nil || pb != nil {
		t.Fatalf("re-append of seq 0 = %d encodings, %v; want none and a seq error", len(pb), err)
	}
}

// TestFailedAppendRollsBack makes an insert fail in the middle of a batch
// (its rows 1 and 2 are written, row 3 fails) and checks that nothing of
// the batch stays and a retry succeeds.
func TestFailedAppendRollsBack(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	var b persistencetest.Builder
	b.CompletedTurn(2)
	first := b.Len()
	b.StartTurn("big")
	b.StartStep()
	b.Chunks(4, strings.Repeat("y", 40<<10))
	b.AssistantMessage("done")
	b.EndStep()
	b.EndTurn()
	evs := b.Events()
	if err := s.Create(t.Context(), persistencetest.Header("f")); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "f", evs[:5]); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, dir)
	failAt := first + 6 // rows at 5, first+5, first+6 (failing), first+7
	if _, err := db.Exec(fmt.Sprintf(`CREATE TRIGGER fail BEFORE INSERT ON batches WHEN NEW.seq = %d BEGIN SELECT RAISE(ABORT, 'injected: disk full'); END`, failAt)); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "f", evs[5:]); err == nil {
		t.Fatal("Append succeeded through a failing insert")
	}
	var rows, stored int
	if err := db.QueryRow(`SELECT count(*), sum(n) FROM batches JOIN sessions USING (sid) WHERE id = 'f'`).Scan(&rows, &stored); err != nil || rows != 1 || stored != 5 {
		t.Fatalf("rows after a failed append = %d holding %d events (%v), want 1 holding 5", rows, stored, err)
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
	if err := db.QueryRow(`SELECT count(*) FROM batches JOIN sessions USING (sid) WHERE id = 'f'`).Scan(&rows); err != nil || rows < 3 {
		t.Fatalf("%d rows (%v): the failing batch did not span rows", rows, err)
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
	for _, n := range []int{1, 16, 100, 1000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			persistencetest.BenchParallel(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) }, n, 4)
		})
	}
}
