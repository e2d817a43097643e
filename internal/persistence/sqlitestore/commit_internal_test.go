package sqlitestore

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// TestGroupCommit holds the committer inside its first commit while n more
// sessions queue their appends (one of them, bad, at a wrong seq, which
// fails its own check before writing; one, broken, failing in its insert,
// after its session row was written, which sends the group down the
// savepoint path), then checks that the n share the next transaction,
// that the bad ones failed alone (nothing of theirs stored) and that every
// other batch is stored — in a fresh store over the same file, as after a
// crash. With 150 sessions the group's rows take three INSERTs (up to
// maxInsertRows each).
func TestGroupCommit(t *testing.T) {
	for _, tt := range []struct {
		name           string
		n, bad, broken int // 0: none
	}{
		{"a check and an insert failing", 12, 5, 7},
		{"more rows than one insert takes, a check failing", 150, 100, 0},
	} {
		t.Run(tt.name, func(t *testing.T) { groupCommit(t, tt.n, tt.bad, tt.broken) })
	}
}

func groupCommit(t *testing.T, n, bad, broken int) {
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var groups []CommitStats
	path := filepath.Join(t.TempDir(), "dsh.db")
	s, err := Open(t.Context(), Config{Path: path, OnCommit: func(c CommitStats) {
		mu.Lock()
		groups = append(groups, c)
		first := len(groups) == 1
		mu.Unlock()
		if first {
			close(entered)
			<-release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if broken > 0 {
		// From another connection, as another process would.
		other(t, path, fmt.Sprintf(`CREATE TRIGGER fail BEFORE INSERT ON batches
		WHEN NEW.sid = (SELECT sid FROM sessions WHERE id = 's%d') BEGIN SELECT RAISE(ABORT, 'injected: disk full'); END`, broken))
	}
	logs := make([][]*sessionv1.SessionEvent, n+1)
	for i := range logs {
		id := fmt.Sprint("s", i)
		if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
			t.Fatal(err)
		}
		var b persistencetest.Builder
		b.CompletedTurn(2)
		logs[i] = b.Events()
	}
	first := make(chan error, 1)
	go func() { first <- s.Append(t.Context(), "s0", logs[0]) }()
	<-entered
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		batch := logs[i]
		if i == bad {
			batch = batch[1:] // starts at seq 1 of an empty log
		}
		wg.Go(func() { errs[i] = s.Append(t.Context(), fmt.Sprint("s", i), batch) })
	}
	for len(s.queue) < n { // wait for all n to queue behind the held commit
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first append: %v", err)
	}
	for i := 1; i <= n; i++ {
		var seqErr *persistence.SeqError
		switch {
		case i == bad && !errors.As(errs[i], &seqErr):
			t.Errorf("append at a wrong seq: got %v, want a *SeqError", errs[i])
		case i == broken && (errs[i] == nil || !strings.Contains(errs[i].Error(), "injected")):
			t.Errorf("append through a failing insert: got %v, want the injected error", errs[i])
		case i != bad && i != broken && errs[i] != nil:
			t.Errorf("session s%d: %v", i, errs[i])
		}
	}
	mu.Lock()
	failing := 0
	for _, i := range []int{bad, broken} {
		if i > 0 {
			failing++
		}
	}
	if len(groups) != 2 || groups[1].Requests != n-failing {
		t.Errorf("groups %+v: want the held one, then one of %d requests", groups, n-failing)
	}
	mu.Unlock()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for i := 0; i <= n; i++ {
		_, got, err := s2.Load(t.Context(), fmt.Sprint("s", i))
		if i > 0 && (i == bad || i == broken) {
			if !errors.Is(err, persistence.ErrNotFound) {
				t.Errorf("the failed session: Load = %d events, %v; want ErrNotFound", len(got), err)
			}
			continue
		}
		if err != nil || len(got) != len(logs[i]) {
			t.Errorf("session s%d: Load = %d events, %v; want %d", i, len(got), err, len(logs[i]))
		}
	}
}

// other runs q on a connection of its own to the database at path.
func other(t testing.TB, path, q string, args ...any) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), q, args...); err != nil {
		t.Fatal(err)
	}
}

// execWriter runs q on the committer's connection, as a write of its own.
func (s *Store) execWriter(t testing.TB, q string) {
	t.Helper()
	err := s.submit(t.Context(), "", func(g *groupTx) error {
		_, err := g.w.conn.(driver.ExecerContext).ExecContext(t.Context(), q, nil)
		return err
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}

// TestCloseAnswersQueuedWrites: appends racing Close either commit or fail
// with ErrClosed; none hangs and none is half stored.
func TestCloseAnswersQueuedWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dsh.db")
	s, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	logs := make([][]*sessionv1.SessionEvent, n)
	for i := range logs {
		if err := s.Create(t.Context(), persistencetest.Header(fmt.Sprint("s", i))); err != nil {
			t.Fatal(err)
		}
		var b persistencetest.Builder
		b.CompletedTurn(1)
		logs[i] = b.Events()
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range logs {
		wg.Go(func() { errs[i] = s.Append(t.Context(), fmt.Sprint("s", i), logs[i]) })
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s2, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for i, e := range errs {
		_, got, err := s2.Load(t.Context(), fmt.Sprint("s", i))
		switch {
		case e == nil && (err != nil || len(got) != len(logs[i])):
			t.Errorf("s%d: Append returned nil but Load = %d events, %v", i, len(got), err)
		case e != nil && !errors.Is(e, persistence.ErrClosed):
			t.Errorf("s%d: Append = %v, want nil or ErrClosed", i, e)
		case e != nil && !errors.Is(err, persistence.ErrNotFound):
			t.Errorf("s%d: Append failed (%v) but Load = %d events, %v", i, e, len(got), err)
		}
	}
}

// TestPositionsFollowAnotherWriter: the committer caches where each
// session's log ends; a batch written by another connection (another
// process on the same file) must not leave it stale. Here the other writer
// stores seqs 4 and 5 after the store appended 0..3 (cached: next 4), and
// the store's append of 6.. must then be accepted (a stale cache would
// refuse it as out of sequence), and one at 4 refused.
func TestPositionsFollowAnotherWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dsh.db")
	s, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var b persistencetest.Builder
	b.CompletedTurn(4)
	evs := b.Events()
	if err := s.Create(t.Context(), persistencetest.Header("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "a", evs[:4]); err != nil {
		t.Fatal(err)
	}
	rows, err := encodeBatch("a", evs[4:6], true)
	if err != nil {
		t.Fatal(err)
	}
	row := rows[0]
	other(t, path, `INSERT INTO batches (sid, seq, n, pb) SELECT sid, ?, ?, ? FROM sessions WHERE id = 'a'`, row.seq, row.n, row.pb)

	if err := s.Append(t.Context(), "a", evs[6:]); err != nil {
		t.Fatalf("append after the other writer's batch: %v", err)
	}
	var seqErr *persistence.SeqError
	if err := s.Append(t.Context(), "a", evs[4:6]); !errors.As(err, &seqErr) {
		t.Errorf("append of seqs 4..5 again: %v, want a *SeqError", err)
	}
	_, got, err := s.Load(t.Context(), "a")
	if err != nil || len(got) != len(evs) {
		t.Fatalf("Load = %d events, %v; want %d", len(got), err, len(evs))
	}
	if err := s.SetPublishedCursor(t.Context(), "a", int64(len(evs))); err != nil {
		t.Errorf("raise the cursor to the end: %v", err)
	}
	var cursorErr *persistence.CursorError
	if err := s.SetPublishedCursor(t.Context(), "a", int64(len(evs))+1); !errors.As(err, &cursorErr) {
		t.Errorf("raise the cursor beyond the end: %v, want a *CursorError", err)
	}
}

// TestStatementRollingTheTransactionBack: a statement that rolls the whole
// transaction back (RAISE(ROLLBACK) here; SQLite does the same on some
// I/O and memory errors) fails the group's append — in the first pass
// and in the savepoint re-run, where ROLLBACK TO then finds no savepoint —
// with nothing of it stored, and leaves no transaction open: the committer's
// ROLLBACK takes "no transaction is active" as done, and the next appends
// (of this session and another) commit.
func TestStatementRollingTheTransactionBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dsh.db")
	s, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logs := map[string][]*sessionv1.SessionEvent{}
	for _, id := range []string{"a", "b"} {
		if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
			t.Fatal(err)
		}
		var b persistencetest.Builder
		b.CompletedTurn(2)
		logs[id] = b.Events()
		if err := s.Append(t.Context(), id, logs[id][:2]); err != nil {
			t.Fatal(err)
		}
	}
	other(t, path, `CREATE TRIGGER fail BEFORE INSERT ON batches
		WHEN NEW.sid = (SELECT sid FROM sessions WHERE id = 'b') BEGIN SELECT RAISE(ROLLBACK, 'injected: rolled back'); END`)
	if err := s.Append(t.Context(), "b", logs["b"][2:4]); err == nil {
		t.Fatal("append through a statement rolling the transaction back: got nil, want an error")
	}
	other(t, path, `DROP TRIGGER fail`)
	for _, id := range []string{"a", "b"} {
		if err := s.Append(t.Context(), id, logs[id][2:]); err != nil {
			t.Fatalf("append to %s after the rolled-back group: %v", id, err)
		}
		_, got, err := s.Load(t.Context(), id)
		if err != nil || len(got) != len(logs[id]) {
			t.Fatalf("session %s: Load = %d events, %v; want %d", id, len(got), err, len(logs[id]))
		}
	}
}

// TestRefusedGroupKeepsPositions: a group in which every request failed
// its own check (nothing written) leaves the committer's cached positions
// as they were — the next group of the same sessions reads nothing — while
// a group whose statement failed still drops them (TestStatementRolling…).
func TestRefusedGroupKeepsPositions(t *testing.T) {
	s, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "dsh.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var b persistencetest.Builder
	b.CompletedTurn(2)
	evs := b.Events()
	for _, id := range []string{"a", "b"} {
		if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
			t.Fatal(err)
		}
		if err := s.Append(t.Context(), id, evs[:4]); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]position{"a": s.positions["a"], "b": s.positions["b"]}
	if want["a"].next != 4 || want["b"].next != 4 {
		t.Fatalf("cached positions %v after the appends, want both at 4", s.positions)
	}
	var seqErr *persistence.SeqError
	if err := s.Append(t.Context(), "a", evs[2:6]); !errors.As(err, &seqErr) {
		t.Fatalf("append at a stale seq: %v, want a *SeqError", err)
	}
	// The committer answered the refused request after its group ended, so
	// reading its state here is ordered after the group's last write.
	for id, p := range want {
		if got, ok := s.positions[id]; !ok || got != p {
			t.Errorf("after a refused group: position of %s %v (cached %v), want %v", id, got, ok, p)
		}
	}
	if err := s.Append(t.Context(), "a", evs[4:]); err != nil {
		t.Fatalf("append after the refused group: %v", err)
	}
}

// TestSetPublishedCursors: one call raises many sessions' cursors in one
// request of one commit; a session's own failure (a cursor beyond its log,
// a session never stored) is its own and leaves the others raised; a lower
// value is a no-op; a failing statement fails the whole call, nothing of
// it kept.
func TestSetPublishedCursors(t *testing.T) {
	var (
		mu     sync.Mutex
		groups []int
	)
	path := filepath.Join(t.TempDir(), "dsh.db")
	s, err := Open(t.Context(), Config{Path: path, OnCommit: func(c CommitStats) {
		mu.Lock()
		groups = append(groups, c.Requests)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var b persistencetest.Builder
	b.CompletedTurn(1)
	evs := b.Events()
	n := int64(len(evs))
	for _, id := range []string{"a", "b", "c"} {
		if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
			t.Fatal(err)
		}
		if err := s.Append(t.Context(), id, evs); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetPublishedCursor(t.Context(), "c", 3); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := len(groups)
	mu.Unlock()
	errs := s.SetPublishedCursors(t.Context(), []string{"a", "b", "x", "c"}, []int64{n, n + 1, 1, 2})
	var cursorErr *persistence.CursorError
	if len(errs) != 4 || errs[0] != nil || !errors.As(errs[1], &cursorErr) || !errors.Is(errs[2], persistence.ErrNotFound) || errs[3] != nil {
		t.Fatalf("SetPublishedCursors = %v; want nil, a *CursorError, ErrNotFound, nil", errs)
	}
	mu.Lock()
	after := groups[before:]
	mu.Unlock()
	if len(after) != 1 || after[0] != 1 {
		t.Errorf("commits of the call: %v requests each, want one commit of one request", after)
	}
	for id, want := range map[string]int64{"a": n, "b": 0, "c": 3} {
		if got, err := s.PublishedCursor(t.Context(), id); err != nil || got != want {
			t.Errorf("cursor of %s = %d, %v; want %d", id, got, err, want)
		}
	}
	if errs := s.SetPublishedCursors(t.Context(), []string{"a"}, nil); errs[0] == nil {
		t.Error("SetPublishedCursors with no value for its session: got nil, want an error")
	}

	// A statement failing (here for b's row) undoes the whole call — c's
	// raise before it included, through the group's savepoint re-run —
	// and reports it for every session.
	other(t, path, `CREATE TRIGGER fail BEFORE INSERT ON cursors
		WHEN NEW.sid = (SELECT sid FROM sessions WHERE id = 'b') BEGIN SELECT RAISE(ABORT, 'injected'); END`)
	errs = s.SetPublishedCursors(t.Context(), []string{"c", "b"}, []int64{n, n})
	if len(errs) != 2 || errs[0] == nil || errs[1] == nil {
		t.Fatalf("SetPublishedCursors through a failing statement = %v; want an error for both", errs)
	}
	if got, err := s.PublishedCursor(t.Context(), "c"); err != nil || got != 3 {
		t.Errorf("cursor of c after the failed call = %d, %v; want 3 (nothing of the call kept)", got, err)
	}
	other(t, path, `DROP TRIGGER fail`)
	for i, err := range s.SetPublishedCursors(t.Context(), []string{"c", "b"}, []int64{n, n}) {
		if err != nil {
			t.Errorf("session %d after the trigger went: %v", i, err)
		}
	}
	for _, id := range []string{"b", "c"} {
		if got, err := s.PublishedCursor(t.Context(), id); err != nil || got != n {
			t.Errorf("cursor of %s = %d, %v; want %d", id, got, err, n)
		}
	}
}
