package persistencetest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

const (
	crashEnvDir  = "DSH_PERSISTENCE_CRASH_DIR"
	crashEnvSeed = "DSH_PERSISTENCE_CRASH_SEED"
	crashEnvID   = "DSH_PERSISTENCE_CRASH_ID"
	// crashRounds is how many kills one session goes through before the
	// test moves to a new session (keeping logs, and reloads, small).
	crashRounds = 8
)

// StoreOpener opens a store over dir outside a test (the crash child has no
// *testing.T).
type StoreOpener func(ctx context.Context, dir string) (persistence.Store, error)

// MaybeRunCrashChild turns the test binary into the crash-test child when
// RunCrash started it: it never returns then. Call it first in TestMain.
//
// The child opens the store, loads (and so repairs) the session or creates
// it, and appends whole turns in batches of random sizes forever, printing
// "acked <next seq>" on stdout after every Append that returned nil.
func MaybeRunCrashChild(open StoreOpener) {
	dir := os.Getenv(crashEnvDir)
	if dir == "" {
		return
	}
	seed, _ := strconv.ParseUint(os.Getenv(crashEnvSeed), 10, 64)
	if err := crashChild(open, dir, os.Getenv(crashEnvID), seed); err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func crashChild(open StoreOpener, dir, crashID string, seed uint64) error {
	ctx := context.Background()
	s, err := open(ctx, dir)
	if err != nil {
		return err
	}
	b := &Builder{}
	_, events, err := s.Load(ctx, crashID)
	switch {
	case err == nil:
		b = Continue(events)
	case persistence.Code(err) == persistence.CodeNotFound:
		if err := s.Create(ctx, Header(crashID)); err != nil {
			return err
		}
	default:
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "ready %d\n", b.Len())
	out.Flush()
	next := b.Len()
	for {
		if b.Len()-next < 64 {
			b.CompletedTurn(1 + rng.IntN(8))
		}
		n := min(1+rng.IntN(24), int(b.Len()-next))
		if err := s.Append(ctx, crashID, b.Events()[next:next+int64(n)]); err != nil {
			return err
		}
		next += int64(n)
		fmt.Fprintf(out, "acked %d\n", next)
		out.Flush()
	}
}

// RunCrash runs the SIGKILL test for about budget (and at least 2 x
// crashRounds iterations): each iteration starts the test binary as a crash
// child (see MaybeRunCrashChild) over one store directory, kills it at a
// random moment, and checks that a reload is valid and balanced, keeps every
// acknowledged event and never rewrites an event an earlier reload returned.
func RunCrash(t *testing.T, open StoreOpener, budget time.Duration) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var (
		prev     []*sessionv1.SessionEvent
		maxAcked int64
		repaired int
		it       int
	)
	start := time.Now()
	for ; it < 2*crashRounds || time.Since(start) < budget; it++ {
		crashID := fmt.Sprintf("crash/session ☃ %d", it/crashRounds)
		if it%crashRounds == 0 {
			prev = nil
		}
		acked, killedAt := runChild(t, dir, crashID, rng.Uint64(), 1+rng.IntN(12), time.Duration(rng.IntN(3000))*time.Microsecond)
		s, err := open(t.Context(), dir)
		if err != nil {
			t.Fatalf("iteration %d: open after kill: %v", it, err)
		}
		_, events, err := s.Load(t.Context(), crashID)
		s.Close()
		if err != nil {
			if acked == 0 && persistence.Code(err) == persistence.CodeNotFound && prev == nil {
				continue // killed before the first append
			}
			t.Fatalf("iteration %d (killed after %v, %d acked): load: %v", it, killedAt, acked, err)
		}
		if int64(len(events)) < acked {
			t.Fatalf("iteration %d: lost acknowledged events: loaded %d, acked %d", it, len(events), acked)
		}
		if err := persistence.CheckLoaded(crashID, events); err != nil {
			t.Fatalf("iteration %d: loaded log invalid: %v", it, err)
		}
		if c := session.InterruptedTurnClosers(events); c != nil {
			t.Fatalf("iteration %d: loaded log still has an open turn", it)
		}
		if len(events) < len(prev) {
			t.Fatalf("iteration %d: the log shrank from %d to %d events", it, len(prev), len(events))
		}
		for i, ev := range prev {
			if !proto.Equal(ev, events[i]) {
				t.Fatalf("iteration %d: a reload rewrote event %d:\nwas %v\nnow %v", it, i, ev, events[i])
			}
		}
		if last := events[len(events)-1]; last.GetTurnEnd().GetReason().GetInterrupted() != nil && int64(len(events)) > acked {
			repaired++
		}
		prev = events
		maxAcked = max(maxAcked, acked)
	}
	if maxAcked == 0 || repaired == 0 {
		t.Fatalf("the test exercised too little: %d events acknowledged, %d open turns repaired", maxAcked, repaired)
	}
	t.Logf("%d kills in %v: %d open turns repaired", it, time.Since(start).Round(time.Millisecond), repaired)
}

// runChild starts a crash child, waits until it acknowledged acks appends,
// lets it run for delay more (so that the kill lands at a random point,
// often inside an append), SIGKILLs it and returns the highest acknowledged
// next seq.
func runChild(t *testing.T, dir, id string, seed uint64, acks int, delay time.Duration) (int64, time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnvDir+"="+dir, crashEnvID+"="+id, crashEnvSeed+"="+strconv.FormatUint(seed, 10))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var acked int64
	var kill <-chan time.Time
	deadline := time.After(30 * time.Second)
	start := time.Now()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				err := cmd.Wait()
				if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
					t.Fatalf("crash child exited by itself (%v): %s", err, stderr.String())
				}
				return acked, time.Since(start)
			}
			if n, ok := strings.CutPrefix(line, "acked "); ok {
				v, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					t.Fatalf("child line %q", line)
				}
				acked = v
				if acks--; acks == 0 {
					kill = time.After(delay)
				}
			} else if strings.HasPrefix(line, "ready ") {
				start = time.Now()
			}
		case <-kill:
			kill = nil
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("crash child never got ready: %s", stderr.String())
		}
	}
}
