package pgtest_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dsh-dev/dsh/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(t.Context()) })
	return c
}

// TestDatabasesAreSeparate checks that every test gets its own database and
// that a key names the same database again.
func TestDatabasesAreSeparate(t *testing.T) {
	a, b := pgtest.Database(t), pgtest.Database(t)
	if a == b {
		t.Fatalf("two calls gave the same database %q", a)
	}
	if _, err := connect(t, a).Exec(t.Context(), "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := connect(t, b).QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("table of database a visible in b: %d (%v)", n, err)
	}
	k1, err := pgtest.DatabaseFor(t.Context(), "key")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := pgtest.DatabaseFor(t.Context(), "key")
	if err != nil || k1 != k2 {
		t.Fatalf("same key: %q then %q (%v)", k1, k2, err)
	}
}

// TestServerIsNotRoot checks that the server does not run as root (it
// would refuse) and is reachable only through its unix socket.
func TestServerIsNotRoot(t *testing.T) {
	c := connect(t, pgtest.Database(t))
	var dir, listen string
	if err := c.QueryRow(t.Context(), "SELECT current_setting('data_directory'), current_setting('listen_addresses')").Scan(&dir, &listen); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == 0 {
		t.Fatalf("data directory %s is owned by root", dir)
	}
	if listen != "" {
		t.Fatalf("listen_addresses = %q, want none (unix socket only)", listen)
	}
}
