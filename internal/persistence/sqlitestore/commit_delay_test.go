package sqlitestore

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// TestArrivalsExpected: the rate the commit delay is decided by closes its
// window before it is used, so a rate from before an idle spell never
// holds the first write after it.
func TestArrivalsExpected(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const d = 2 * time.Millisecond
	// busy counts 2,000 writes a second over one window (40 in 20 ms,
	// the first one opening it) and returns the expectation at its end.
	busy := func(a *arrivals) float64 {
		a.expected(t0, d) // opens the window (this write counted by the last one)
		a.add(40)
		return a.expected(t0.Add(rateWindow), d)
	}
	for _, tt := range []struct {
		name  string
		steps func(a *arrivals) float64
		want  float64
	}{
		{"the first write ever", func(a *arrivals) float64 { return a.expected(t0, d) }, 0},
		{"2,000 writes a second over a window: 4 in 2 ms", busy, 4},
		{"inside a window the last rate holds", func(a *arrivals) float64 {
			busy(a)
			a.add(1)
			return a.expected(t0.Add(rateWindow+time.Millisecond), d)
		}, 4},
		{"a busy rate does not outlive an idle second", func(a *arrivals) float64 {
			busy(a)
			a.add(1)
			return a.expected(t0.Add(rateWindow+time.Second), d)
		}, 0.002},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var a arrivals
			if got := tt.steps(&a); got < tt.want*0.99 || got > tt.want*1.01+1e-9 {
				t.Errorf("expected = %.4f, want %.4f", got, tt.want)
			}
		})
	}
}

// TestCommitDelayGroupsBusySessions: sessions appending in a loop (each
// waits for its own append, as a session's flush does) share a commit when
// the committer holds the group open. Until the committer has counted the
// writes' rate over a window it does not hold, and the sessions go as fast
// as they can in groups of one to a few; from then on each hold gathers
// every session's next append. Without the hold a group of all the
// sessions comes alone, never 20 in a row.
func TestCommitDelayGroupsBusySessions(t *testing.T) {
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
		t.Errorf("groups %v: never %d in a row of all %d sessions in 20 s (each hold gathers every session)", sizes, inARow, sessions)
	}
}

// TestLoneSessionIsNotHeld: one session appending in a loop, as fast as
// it can and for longer than the rate's window, never waits for the
// commit delay: its groups hold one append, so the committer never sees
// sessions writing together (by the rate alone it would hold). The delay
// is a minute, so a hold cannot pass for a slow append.
func TestLoneSessionIsNotHeld(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	s, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "dsh.db"), Synchronous: "NORMAL",
		OnCommit: func(c CommitStats) {
			mu.Lock()
			sizes = append(sizes, c.Requests)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.commitDelay = time.Minute // before the first write: its send orders this before the committer's reads
	if err := s.Create(t.Context(), persistencetest.Header("lone")); err != nil {
		t.Fatal(err)
	}
	var b persistencetest.Builder
	appends := 0
	for start := time.Now(); time.Since(start) < 10*rateWindow; appends++ {
		begin := time.Now()
		if err := s.Append(t.Context(), "lone", nextTurn(&b)); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(begin); el >= 10*time.Second {
			t.Fatalf("append %d took %v: the lone session waited for the commit delay", appends, el)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Max(sizes) != 1 {
		t.Errorf("groups %v: a lone session's appends commit alone", sizes)
	}
	t.Logf("%d appends in %v", appends, 10*rateWindow)
}

// TestCloseEndsTheHold: Close does not wait out a commit delay; what is
// queued is committed.
func TestCloseEndsTheHold(t *testing.T) {
	s, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "dsh.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Create(t.Context(), persistencetest.Header("s")); err != nil {
		t.Fatal(err)
	}
	// Make the committer hold its next group for a minute: two sessions
	// seen in one group and a rate far above two writes per delay. (The
	// committer waits on the queue; the append's send orders these writes
	// before its reads.)
	s.commitDelay = time.Minute
	s.lastAppends = 2
	s.arrivals = arrivals{start: time.Now(), rate: 1e6}
	var b persistencetest.Builder
	batch := nextTurn(&b)
	done := make(chan error, 1)
	go func() { done <- s.Append(t.Context(), "s", batch) }()
	time.Sleep(20 * time.Millisecond) // the committer takes it and holds
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el >= 30*time.Second {
		t.Errorf("Close took %v: it waited out the commit delay", el)
	}
	if err := <-done; err != nil {
		t.Errorf("the held append: %v; want it committed at Close", err)
	}
}

// nextTurn adds one completed turn to b and returns its events.
func nextTurn(b *persistencetest.Builder) []*sessionv1.SessionEvent {
	n := b.Len()
	b.CompletedTurn(1)
	return b.Events()[n:]
}
