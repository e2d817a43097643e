// Package pgtest runs a throwaway PostgreSQL server for tests, with no
// Docker: Debian's binaries (initdb, postgres from /usr/lib/postgresql/N/bin)
// in a temporary directory, as the unprivileged user nobody when the test
// runs as root (postgres refuses to run as root), listening only on a unix
// socket inside that directory.
//
// One server serves a whole test binary: call Main from TestMain (or Lazy,
// in a package where few tests need a server: it starts when the first test
// asks for a database). Each test takes a fresh database with Database (or
// DatabaseFor, keyed by a string, for openers that must find the same
// database again, in the test binary and in the child processes it starts:
// they inherit the server's address through the environment). Main and Lazy
// stop the server and remove its directory at the end.
//
// When the binaries are missing, tests that ask for a database are skipped
// with a message saying what to install, unless DSH_REQUIRE_POSTGRES is set
// (`make test` sets it after `make setup` installed postgresql): then Main
// fails. A server that is installed but does not start always fails.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// EnvRequire, when set, turns missing binaries into a failure.
	EnvRequire = "DSH_REQUIRE_POSTGRES"
	// EnvBin overrides the directory holding initdb and postgres.
	EnvBin = "DSH_POSTGRES_BIN"
	// envBase carries the running server's connection string without a
	// database to the tests and to child processes.
	envBase = "DSH_PGTEST_BASE_DSN"

	superuser = "dsh"
	port      = 5432 // only names the socket file; nothing listens on TCP
)

// BinDir returns the directory holding initdb and postgres: $DSH_POSTGRES_BIN,
// or the newest /usr/lib/postgresql/N/bin.
func BinDir() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		return d, checkBin(d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if checkBin(d) == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (install Debian's postgresql: `make setup`, or set " + EnvBin + ")")
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func checkBin(dir string) error {
	for _, b := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s: no executable %s", dir, b)
		}
	}
	return nil
}

// Server is a running PostgreSQL server in a temporary directory.
type Server struct {
	dir  string // removed by Stop
	base string // connection string without dbname
	cmd  *exec.Cmd
	done chan struct{}
	err  error // postgres's exit, once done is closed
}

// Start initialises a cluster in a new temporary directory and starts
// postgres on a unix socket in it. When the process runs as root, the
// server runs as the user nobody. The caller should lock its OS thread
// (postgres gets SIGKILL when the starting thread exits) and must Stop it.
func Start(ctx context.Context, binDir string) (*Server, error) {
	dir, err := os.MkdirTemp("", "dsh-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{dir: dir, done: make(chan struct{})}
	if err := s.start(ctx, binDir); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context, binDir string) error {
	cred, err := credential()
	if err != nil {
		return err
	}
	data, sock := filepath.Join(s.dir, "data"), filepath.Join(s.dir, "sock")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		for _, p := range []string{s.dir, sock} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("pgtest: chown %s: %w", p, err)
			}
		}
	}
	cmd := func(name string, args ...string) *exec.Cmd {
		c := exec.Command(filepath.Join(binDir, name), args...)
		c.Dir = s.dir
		c.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "LC_ALL=C", "TZ=UTC"}
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
		return c
	}
	initdb := cmd("initdb", "-D", data, "-U", superuser, "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	logf, err := os.Create(filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	s.cmd = cmd("postgres", "-D", data, "-k", sock, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=", "-c", "max_connections=400", "-c", "shared_buffers=32MB",
		"-c", "log_min_messages=warning", "-c", "log_checkpoints=off")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	s.base = fmt.Sprintf("host=%s port=%d user=%s sslmode=disable", sock, port, superuser)
	return s.waitReady(ctx)
}

// credential returns the user postgres runs as: nil (this user) unless
// this process is root, then nobody.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root and no unprivileged user to run postgres as: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// waitReady polls until the server accepts connections, it exits, or 60 s
// pass.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := pgconn.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			return c.Close(ctx)
		}
		select {
		case <-s.done:
			return fmt.Errorf("pgtest: postgres exited (%v):\n%s", s.err, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("pgtest: postgres not ready: %w (last: %v)\n%s", ctx.Err(), err, s.logTail())
		case <-tick.C:
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// DSN returns the connection string of database db on this server.
func (s *Server) DSN(db string) string { return s.base + " dbname=" + db }

// Stop shuts the server down (immediate shutdown: its data is thrown away,
// so no shutdown checkpoint; SIGKILL after 10 s) and removes its directory.
func (s *Server) Stop() error {
	var err error
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
			err = errors.New("pgtest: postgres did not stop within 10 s; killed")
		}
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// Main runs the tests of a package with one server: call it from TestMain
// as os.Exit(pgtest.Main(m)). A process started by a test (it inherits the
// server's address) uses the running server and starts none.
func Main(m *testing.M) int {
	if os.Getenv(envBase) != "" {
		return m.Run()
	}
	bin, err := BinDir()
	if err != nil {
		if os.Getenv(EnvRequire) != "" {
			fmt.Fprintf(os.Stderr, "pgtest: %v; %s is set, so this is a failure\n", err, EnvRequire)
			return 1
		}
		return m.Run() // Database skips
	}
	runtime.LockOSThread() // postgres's parent-death signal follows this thread
	defer runtime.UnlockOSThread()
	srv, err := Start(context.Background(), bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv(envBase, srv.base)
	code := m.Run()
	os.Unsetenv(envBase)
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// lazy is the server Lazy starts for the first test that asks for one.
var lazy struct {
	sync.Mutex
	on      bool          // Lazy is running the tests
	started bool          // a start was tried; err is its failure
	err     error         // given to every test that asks
	stop    chan struct{} // closed when the tests ended
	stopped chan error    // the server's Stop
}

// Lazy is Main for a package whose tests seldom need a server (starting
// one costs seconds): the server starts when a test first asks for a
// database (Database, DatabaseFor, Require) and stops when the tests end.
// Missing binaries skip the tests that ask, or fail them when
// DSH_REQUIRE_POSTGRES is set.
func Lazy(m *testing.M) int {
	if os.Getenv(envBase) != "" {
		return m.Run()
	}
	lazy.Lock()
	lazy.on = true
	lazy.Unlock()
	code := m.Run()
	lazy.Lock()
	lazy.on = false
	running := lazy.started && lazy.err == nil
	lazy.Unlock()
	if running {
		close(lazy.stop)
		err := <-lazy.stopped
		os.Unsetenv(envBase)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// startLazy starts Lazy's server unless it was tried already; on reports
// whether Lazy runs the tests, err why there is no server.
func startLazy() (on bool, err error) {
	lazy.Lock()
	defer lazy.Unlock() // tests asking meanwhile wait for this start
	if !lazy.on || lazy.started {
		return lazy.on, lazy.err
	}
	lazy.started = true
	bin, err := BinDir()
	if err != nil {
		lazy.err = err
		return true, err
	}
	type result struct {
		srv *Server
		err error
	}
	res := make(chan result, 1)
	lazy.stop, lazy.stopped = make(chan struct{}), make(chan error, 1)
	go func() {
		// postgres's parent-death signal follows the thread that started
		// it: this goroutine keeps that thread until the server stopped.
		runtime.LockOSThread()
		srv, err := Start(context.Background(), bin)
		res <- result{srv, err}
		if err != nil {
			return
		}
		<-lazy.stop
		lazy.stopped <- srv.Stop()
	}()
	r := <-res
	if r.err != nil {
		lazy.err = r.err
		return true, r.err
	}
	os.Setenv(envBase, r.srv.base)
	return true, nil
}

// Database creates a fresh database for the test and returns its DSN. It
// skips the test when no server can run here (see the package doc).
func Database(t testing.TB) string {
	t.Helper()
	Require(t)
	dsn, err := DatabaseFor(t.Context(), t.Name()+"\x00"+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Require starts Lazy's server if it is not running yet; it skips the test
// when the PostgreSQL binaries are missing (and DSH_REQUIRE_POSTGRES is
// unset, else Main already failed, or Lazy fails the test), and fails it
// when no server started.
func Require(t testing.TB) {
	t.Helper()
	if Available() {
		return
	}
	on, err := startLazy()
	if on && err == nil {
		return
	}
	if _, berr := BinDir(); berr != nil {
		if on && os.Getenv(EnvRequire) != "" {
			t.Fatalf("pgtest: %v; %s is set, so this is a failure", berr, EnvRequire)
		}
		t.Skipf("PostgreSQL tests skipped: %v; set %s=1 to make this a failure", berr, EnvRequire)
	}
	if on {
		t.Fatal(err)
	}
	t.Fatal("pgtest: no server: call os.Exit(pgtest.Main(m)) (or pgtest.Lazy) from TestMain")
}

var errNoServer = errors.New("pgtest: no PostgreSQL server for this test binary")

// Available reports whether a server runs for this test binary.
func Available() bool { return os.Getenv(envBase) != "" }

// DatabaseFor returns the DSN of the database named after key, creating it
// on first use: the same key gives the same database, in this process and
// in the processes it starts.
func DatabaseFor(ctx context.Context, key string) (string, error) {
	if on, err := startLazy(); on && err != nil {
		return "", err
	}
	base := os.Getenv(envBase)
	if base == "" {
		return "", errNoServer
	}
	sum := sha256.Sum256([]byte(key))
	name := "t_" + hex.EncodeToString(sum[:12])
	conn, err := pgx.Connect(ctx, base+" dbname=postgres")
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") { // duplicate_database
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return strings.TrimSpace(base) + " dbname=" + name, nil
}
