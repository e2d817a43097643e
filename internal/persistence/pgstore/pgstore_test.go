package pgstore_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/pgstore"
	"github.com/dsh-dev/dsh/internal/pgtest"
)

// openAt opens a store over the database named after dir: the suites reopen
// the same dir to check what is durable, and the crash child (which
// inherits the server's address) finds the same database.
func openAt(ctx context.Context, dir string) (persistence.Store, error) {
	dsn, err := pgtest.DatabaseFor(ctx, dir)
	if err != nil {
		return nil, err
	}
	return pgstore.Open(ctx, pgstore.Config{DSN: dsn, MaxConns: 4})
}

func TestMain(m *testing.M) {
	persistencetest.MaybeRunCrashChild(openAt)
	os.Exit(pgtest.Main(m))
}

func open(t testing.TB, dir string) persistence.Store {
	t.Helper()
	pgtest.Require(t)
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
	pgtest.Require(t)
	persistencetest.RunCrash(t, openAt, 8*time.Second)
}

func BenchmarkStore(b *testing.B) {
	persistencetest.Bench(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) })
}

// fresh opens a store over a new database and returns it with a raw
// connection to the same database.
func fresh(t *testing.T, cfg pgstore.Config) (*pgstore.Store, *pgx.Conn, string) {
	t.Helper()
	dsn := pgtest.Database(t)
	cfg.DSN = dsn
	s, err := pgstore.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rawConn(t, dsn), dsn
}

func rawConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// stored appends n completed turns to a new session.
func stored(t *testing.T, s persistence.Store, id string, n int) *persistencetest.Builder {
	t.Helper()
	var b persistencetest.Builder
	for range n {
		b.CompletedTurn(2)
	}
	if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), id, b.Events()); err != nil {
		t.Fatal(err)
	}
	return &b
}

func TestSchemaVersionRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		sql  string
	}{
		{"newer version", "INSERT INTO dsh_schema_version (version) VALUES (99)"},
		{"tables without version", "DROP TABLE dsh_schema_version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, c, dsn := fresh(t, pgstore.Config{})
			stored(t, s, "v", 1)
			s.Close()
			exec(t, c, tt.sql)
			_, err := pgstore.Open(t.Context(), pgstore.Config{DSN: dsn})
			if !errors.Is(err, persistence.ErrUnknownVersion) {
				t.Fatalf("Open: %v, want ErrUnknownVersion", err)
			}
		})
	}
}

// TestMigrationOnce opens several stores on a fresh database at once:
// every one succeeds and the schema is migrated exactly once.
func TestMigrationOnce(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Database(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := pgstore.Open(t.Context(), pgstore.Config{DSN: dsn, MaxConns: 2})
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var rows, version int
	if err := rawConn(t, dsn).QueryRow(t.Context(), `SELECT count(*), max(version) FROM dsh_schema_version`).Scan(&rows, &version); err != nil {
		t.Fatal(err)
	}
	if rows != pgstore.SchemaVersion || version != pgstore.SchemaVersion {
		t.Fatalf("%d version rows up to %d, want %d", rows, version, pgstore.SchemaVersion)
	}
}

// TestOneEncodingPerEvent checks that an event row holds the event once
// (protobuf) and that the view for people reads the log.
func TestOneEncodingPerEvent(t *testing.T) {
	t.Parallel()
	s, c, _ := fresh(t, pgstore.Config{})
	b := stored(t, s, "r", 1)
	var cols int
	if err := c.QueryRow(t.Context(), `SELECT count(*) FROM information_schema.columns WHERE table_name = 'dsh_events' AND data_type IN ('text', 'bytea', 'json', 'jsonb') AND column_name NOT IN ('session_id', 'type')`).Scan(&cols); err != nil || cols != 1 {
		t.Fatalf("dsh_events has %d payload columns (%v), want 1", cols, err)
	}
	rows, err := c.Query(t.Context(), `SELECT seq, type, bytes FROM dsh_event_log WHERE session_id = 'r' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		seq, n int64
		typ    string
		bytes  int
	)
	_, err = pgx.ForEachRow(rows, []any{&seq, &typ, &bytes}, func() error {
		if seq != n || typ == "" || bytes <= 0 {
			t.Errorf("row %d: seq %d type %q bytes %d", n, seq, typ, bytes)
		}
		n++
		return nil
	})
	if err != nil || n != b.Len() {
		t.Fatalf("%d rows (%v), want %d", n, err, b.Len())
	}
}

// TestFailedAppendRollsBack makes the insert fail and checks that nothing
// of the batch stays and a retry succeeds.
func TestFailedAppendRollsBack(t *testing.T) {
	t.Parallel()
	s, c, _ := fresh(t, pgstore.Config{})
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
	exec(t, c, `CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.seq = 30 THEN RAISE EXCEPTION 'injected: disk full'; END IF; RETURN NEW; END $$`)
	exec(t, c, `CREATE TRIGGER fail BEFORE INSERT ON dsh_events FOR EACH ROW EXECUTE FUNCTION fail()`)
	if err := s.Append(t.Context(), "f", evs[5:45]); err == nil {
		t.Fatal("Append succeeded through a failing insert")
	}
	var rows, next int64
	if err := c.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM dsh_events WHERE session_id = 'f'), next_seq FROM dsh_sessions WHERE id = 'f'`).Scan(&rows, &next); err != nil || rows != 5 || next != 5 {
		t.Fatalf("after a failed append: %d rows, next_seq %d (%v); want 5, 5", rows, next, err)
	}
	exec(t, c, `DROP TRIGGER fail ON dsh_events`)
	if err := s.Append(t.Context(), "f", evs[5:]); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if _, got, err := s.Load(t.Context(), "f"); err != nil || len(got) != len(evs) {
		t.Fatalf("Load: %d events, %v; want %d", len(got), err, len(evs))
	}
	if err := s.CheckStorage(t.Context(), "f"); err != nil {
		t.Fatalf("CheckStorage: %v", err)
	}
}

// TestCheckStorageFindsTampering edits rows behind the store's back.
func TestCheckStorageFindsTampering(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, sql string }{
		{"type column", `UPDATE dsh_events SET type = 'tool/call' WHERE session_id = 'x' AND seq = 0`},
		{"next_seq", `UPDATE dsh_sessions SET next_seq = next_seq + 1 WHERE id = 'x'`},
		{"pb", `UPDATE dsh_events SET pb = '\xff'::bytea WHERE session_id = 'x' AND seq = 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, c, _ := fresh(t, pgstore.Config{})
			stored(t, s, "x", 1)
			exec(t, c, tt.sql)
			if err := s.CheckStorage(t.Context(), "x"); err == nil {
				t.Fatal("CheckStorage found nothing")
			}
		})
	}
}

// BenchmarkFencedAppend measures appends of a replica (a fenced store:
// every append also checks the lease's epoch).
func BenchmarkFencedAppend(b *testing.B) {
	persistencetest.BenchAppend(b, func(b *testing.B, dir string) persistence.Store {
		pgtest.Require(b)
		dsn, err := pgtest.DatabaseFor(b.Context(), dir)
		if err != nil {
			b.Fatal(err)
		}
		s, err := pgstore.Open(b.Context(), pgstore.Config{DSN: dsn, Owner: "bench-replica"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Claim(b.Context(), "bench", "127.0.0.1:7700", time.Hour); err != nil {
			b.Fatal(err)
		}
		return s
	}, 1, 100)
}

// BenchmarkParallelSessions: 16 sessions appending turns of 20 events at
// once (PostgreSQL shares WAL flushes between concurrent commits).
func BenchmarkParallelSessions(b *testing.B) {
	persistencetest.BenchParallel(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) }, 16, 20)
}
