package sqlitestore

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// TestArrivalsWant: how many appends a group gathers under the commit
// delay, from the writes and the appending sessions of the last window.
func TestArrivalsWant(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const d = 2 * time.Millisecond
	// writes returns n writes, appends of the given sessions in turn ("":
	// a cursor raise).
	writes := func(n int, sessions ...string) []*writeReq {
		g := make([]*writeReq, n)
		for i := range g {
			g[i] = &writeReq{session: sessions[i%len(sessions)]}
		}
		return g
	}
	// window counts group over one window (2,000 appends a second for 40)
	// and returns want at its end.
	window := func(a *arrivals, group []*writeReq) int {
		a.want(t0, d) // opens the window
		a.add(group)
		return a.want(t0.Add(rateWindow), d)
	}
	eight := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, tt := range []struct {
		name  string
		steps func(a *arrivals) int
		want  int
	}{
		{"the first write ever", func(a *arrivals) int { return a.want(t0, d) }, 0},
		{"eight sessions at 2,000 appends a second: all eight",
			func(a *arrivals) int { return window(a, writes(40, eight...)) }, 8},
		{"two sessions as fast: no more than the two of them",
			func(a *arrivals) int { return window(a, writes(40, "a", "b")) }, 2},
		{"one session as fast: not held", func(a *arrivals) int { return window(a, writes(40, "a")) }, 0},
		{"one session and cursor raises: not held", func(a *arrivals) int { return window(a, writes(40, "a", "")) }, 0},
		{"eight sessions appending seldom (4 in a window): not held", func(a *arrivals) int { return window(a, writes(4, eight...)) }, 0},
		{"inside a window the last one holds", func(a *arrivals) int {
			window(a, writes(40, eight...))
			a.add(writes(1, "a"))
			return a.want(t0.Add(rateWindow+time.Millisecond), d)
		}, 8},
		{"a busy window does not outlive an idle second", func(a *arrivals) int {
			window(a, writes(40, eight...))
			a.add(writes(1, "a"))
			return a.want(t0.Add(rateWindow+time.Second), d)
		}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var a arrivals
			if got := tt.steps(&a); got != tt.want {
				t.Errorf("want = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestCommitDelayGroupsBusySessions: sessions appending in a loop (each
// waits for its own append, as a session's flush does) share a commit when
// the committer holds the group open. Until the committer has counted the
// writes over a window it does not hold, and the sessions go as fast as
// they can in groups of one to a few; from then on each hold gathers every
// session's next append. Without the hold a group of all the sessions
// comes alone, never 20 in a row.
func TestCommitDelayGroupsBusySessions(t *testing.T) {
	watchdog(t, time.Minute)
	const sessions, inARow = 8, 20
	stop := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	run := 0
	s, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "dsh.db"), Synchronous: "NORMAL",
		CommitDelay: 10 * time.Millisecond, OnCommit: func(c CommitStats) {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, c.Requests)
			if c.Requests != sessions {
				run = 0
			} else if run++; run == inARow {
				close(stop)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A second, not the 10 ms given: on a starved machine the sessions may
	// take longer than 10 ms to come back, and the test is about the hold
	// gathering them (before the first write: its send orders this before
	// the committer's reads).
	s.commitDelay = time.Second
	for i := range sessions {
		if err := s.Create(t.Context(), persistencetest.Header(fmt.Sprint("s", i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			var b persistencetest.Builder
			for {
				select {
				case <-stop:
					return
				default:
				}
				if time.Now().After(deadline) {
					return
				}
				if err := s.Append(t.Context(), fmt.Sprint("s", i), nextTurn(&b)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-stop:
	default:
		mu.Lock()
		defer mu.Unlock()
		t.Errorf("never %d groups in a row of all %d sessions in 20 s (each hold gathers every session); %d groups, the last: %v",
			inARow, sessions, len(sizes), sizes[max(0, len(sizes)-50):])
	}
}

// TestHeldOnlyWhileOthersWrite: with a commit delay of a minute, sessions
// appending as fast as they can are held no longer than it takes the
// others to come in: a lone session, also beside a stream of cursor raises
// (which are not appends), is never held in ten windows; two sessions are,
// each hold ending when both are in, so their shared commits come one
// after another (a hold of the whole delay would leave one).
// Close ends the last hold, whose sibling stopped writing.
func TestHeldOnlyWhileOthersWrite(t *testing.T) {
	for _, tt := range []struct {
		name     string
		sessions int
		raises   bool
	}{
		{"a lone session", 1, false},
		{"a lone session beside cursor raises", 1, true},
		{"two sessions", 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			watchdog(t, time.Minute)
			var mu sync.Mutex
			shared := 0 // commits holding both sessions' appends
			enough := make(chan struct{})
			s, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "dsh.db"), Synchronous: "NORMAL",
				OnCommit: func(c CommitStats) {
					if c.Requests == 2 && tt.sessions == 2 {
						mu.Lock()
						if shared++; shared == 10 {
							close(enough)
						}
						mu.Unlock()
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var holds atomic.Int64
			// Before the first write: its send orders these before the
			// committer's reads.
			s.commitDelay = time.Minute
			s.holdHook = func() { holds.Add(1) }
			builders := make([]persistencetest.Builder, tt.sessions)
			for i := range tt.sessions {
				id := fmt.Sprint("s", i)
				if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
					t.Fatal(err)
				}
				if err := s.Append(t.Context(), id, nextTurn(&builders[i])); err != nil { // stored: its cursor can be raised
					t.Fatal(err)
				}
			}
			firstTurn := builders[0].Len()
			done := make(chan struct{})
			var wg sync.WaitGroup
			// ended is true once the test is over and Close may have
			// answered a write.
			ended := func(err error) bool {
				select {
				case <-done:
					return errors.Is(err, persistence.ErrClosed) || err == nil
				default:
					return false
				}
			}
			if tt.raises {
				wg.Go(func() {
					// Up to the first turn's end, which is durable;
					// past it a raise is a write that changes nothing.
					for i := int64(0); ; i++ {
						err := s.SetPublishedCursor(t.Context(), "s0", 1+i%firstTurn)
						if ended(err) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			for i := range tt.sessions {
				wg.Go(func() {
					for {
						err := s.Append(t.Context(), fmt.Sprint("s", i), nextTurn(&builders[i]))
						if ended(err) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			// A lone session runs for ten windows (a hold would come in
			// the first few); two run until ten shared commits, or 20 s.
			if tt.sessions == 1 {
				time.Sleep(10 * rateWindow)
			} else {
				select {
				case <-enough:
				case <-time.After(20 * time.Second):
				}
			}
			close(done)
			if err := s.Close(); err != nil { // ends the last hold
				t.Fatal(err)
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tt.sessions == 1 && holds.Load() != 0:
				t.Errorf("a lone session was held %d times", holds.Load())
			case tt.sessions == 2 && shared < 10:
				t.Errorf("%d commits held both sessions' appends (%d holds); want them one after another, each hold ending when both are in", shared, holds.Load())
			}
		})
	}
}

// TestCloseEndsTheHold: Close does not wait out a commit delay, also when
// more appends than a group takes are in flight (the hold takes them from
// the queue, so writers never wait on a full queue behind it); what was
// accepted is committed.
func TestCloseEndsTheHold(t *testing.T) {
	for _, appends := range []int{1, maxGroup + 88} {
		t.Run(fmt.Sprint(appends, " appends"), func(t *testing.T) {
			watchdog(t, time.Minute)
			path := filepath.Join(t.TempDir(), "dsh.db")
			s, err := Open(t.Context(), Config{Path: path, Synchronous: "NORMAL"})
			if err != nil {
				t.Fatal(err)
			}
			batches := make([][]*sessionv1.SessionEvent, appends)
			for i := range batches {
				if err := s.Create(t.Context(), persistencetest.Header(fmt.Sprint("s", i))); err != nil {
					t.Fatal(err)
				}
				var b persistencetest.Builder
				batches[i] = nextTurn(&b)
			}
			// The committer holds its groups for a minute, gathering every
			// session's append: sessions seen appending and a rate far
			// above two writes per delay, in a window that does not close
			// during the test. (It waits on the queue; the first append's
			// send orders these writes before its reads.)
			held := make(chan struct{})
			s.holdHook = sync.OnceFunc(func() { close(held) })
			s.commitDelay = time.Minute
			s.arrivals = arrivals{start: time.Now().Add(time.Hour), rate: 1e6, siblings: 2 * maxGroup}
			errs := make([]error, appends)
			var wg sync.WaitGroup
			for i := range batches {
				wg.Go(func() { errs[i] = s.Append(t.Context(), fmt.Sprint("s", i), batches[i]) })
			}
			<-held
			start := time.Now()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if el := time.Since(start); el >= 30*time.Second {
				t.Errorf("Close took %v: it waited out the commit delay", el)
			}
			wg.Wait()
			s2, err := Open(t.Context(), Config{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			committed := 0
			for i, e := range errs {
				_, got, err := s2.Load(t.Context(), fmt.Sprint("s", i))
				switch {
				case e == nil && (err != nil || len(got) != len(batches[i])):
					t.Errorf("s%d: Append returned nil but Load = %d events, %v", i, len(got), err)
				case e == nil:
					committed++
				}
			}
			if committed == 0 {
				t.Errorf("no held append was committed at Close: %v", errs[0])
			}
		})
	}
}

// watchdog fails the test binary if the test runs longer than d: a hold
// that never ends would otherwise hang the suite until go test's timeout
// (an Append, once queued, waits for its answer whatever its context).
func watchdog(t *testing.T, d time.Duration) {
	timer := time.AfterFunc(d, func() { panic(fmt.Sprintf("%s: still running after %v (a commit hold that never ends?)", t.Name(), d)) })
	t.Cleanup(func() { timer.Stop() })
}

// nextTurn adds one completed turn to b and returns its events.
func nextTurn(b *persistencetest.Builder) []*sessionv1.SessionEvent {
	n := b.Len()
	b.CompletedTurn(1)
	return b.Events()[n:]
}
