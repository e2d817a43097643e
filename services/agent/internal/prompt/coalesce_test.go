package prompt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// gatedHost answers each GetWorkspaceContext with what "disk" held when the
// call started (its project root: the workspace root it was asked within),
// and holds every call until the test releases it.
type gatedHost struct {
	disk    atomic.Value // string
	calls   atomic.Int32
	started chan int32
	release chan struct{}
}

func newGatedHost(content string) *gatedHost {
	g := &gatedHost{started: make(chan int32, 16), release: make(chan struct{})}
	g.disk.Store(content)
	return g
}

func (g *gatedHost) GetWorkspaceContext(ctx context.Context, in *toolsv1.GetWorkspaceContextRequest, _ ...grpc.CallOption) (*toolsv1.GetWorkspaceContextResponse, error) {
	content := g.disk.Load().(string)
	g.started <- g.calls.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, Version: content, ProjectRoot: in.GetWorkspaceRoot(),
		Instructions: []*toolsv1.InstructionFile{{Path: in.GetCwd() + "/AGENTS.md", Content: content}}}, nil
}

// waitCallers spins until n callers of (host, cwd) wait, on the read in
// flight or on the next one.
func waitCallers(w *Workspaces, host, cwd string, n int) {
	for {
		w.reads.mu.Lock()
		joined := 0
		if st := w.reads.pending[readKey{host, cwd, ""}]; st != nil {
			for _, f := range []*flight{st.running, st.next} {
				if f != nil {
					joined += f.callers
				}
			}
		}
		w.reads.mu.Unlock()
		if joined == n {
			return
		}
		runtime.Gosched()
	}
}

// TestWorkspaceReadsNeverStale: callers that ask while a read is in flight
// share the next read, never the one in flight — an AGENTS.md edited before
// their turn started is what they get — and a burst of them costs one call.
func TestWorkspaceReadsNeverStale(t *testing.T) {
	t.Parallel()
	g := newGatedHost("old")
	w := &Workspaces{Hosts: []Host{{"h", g}}}
	first := make(chan *toolsv1.GetWorkspaceContextResponse, 1)
	go func() {
		r, err := w.Context(t.Context(), "/w", "", nil)
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	if n := <-g.started; n != 1 {
		t.Fatalf("call %d started first", n)
	}
	g.disk.Store("edited") // after the first read looked, before the others ask

	const late = 20
	var wg sync.WaitGroup
	got := make([]string, late)
	for i := range late {
		wg.Go(func() {
			r, err := w.Context(t.Context(), "/w", "", nil)
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = r.GetInstructions()[0].GetContent()
		})
	}
	waitCallers(w, "h", "/w", 1+late)
	g.release <- struct{}{} // the first read answers with what it saw
	if r := <-first; r.GetInstructions()[0].GetContent() != "old" {
		t.Errorf("first caller got %q", r.GetInstructions()[0].GetContent())
	}
	close(g.release)
	wg.Wait()
	for i, c := range got {
		if c != "edited" {
			t.Errorf("late caller %d got %q, want the edit made before it asked", i, c)
		}
	}
	if n := g.calls.Load(); n != 2 {
		t.Errorf("%d calls for 1 + %d callers, want 2", n, late)
	}
	w.reads.mu.Lock()
	if len(w.reads.pending) != 0 {
		t.Errorf("reads left pending: %v", w.reads.pending)
	}
	w.reads.mu.Unlock()
}

// TestWorkspaceReadCallerCancels: a caller whose context ends stops
// waiting with its error; the read goes on for the others.
func TestWorkspaceReadCallerCancels(t *testing.T) {
	t.Parallel()
	g := newGatedHost("text")
	w := &Workspaces{Hosts: []Host{{"h", g}}}
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() {
		_, err := w.Context(ctx, "/w", "", nil)
		gone <- err
	}()
	<-g.started
	stays := make(chan *toolsv1.GetWorkspaceContextResponse, 1)
	go func() {
		r, err := w.Context(t.Context(), "/w", "", nil)
		if err != nil {
			t.Error(err)
		}
		stays <- r
	}()
	waitCallers(w, "h", "/w", 2)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller got %v", err)
	}
	close(g.release)
	if r := <-stays; r.GetVersion() != "h:text" {
		t.Errorf("remaining caller got %v", r)
	}
}

// TestWorkspaceReadsSeeEdits runs sessions' reads against the real
// toolhost: after AGENTS.md and a skill are edited, every read made from
// then on — many at once — sees the edit, and different cwds are not mixed.
func TestWorkspaceReadsSeeEdits(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	write := func(rel, body string) {
		t.Helper()
		p := filepath.Join(h.Workspace, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".git/HEAD", "ref: refs/heads/main\n") // the project root: instructions from it down to the cwd
	write("AGENTS.md", "round 0\n")
	write("sub/AGENTS.md", "sub rules\n")
	w := &Workspaces{Hosts: []Host{{"builtin", h.Client}}}
	for round := 1; round <= 3; round++ {
		write("AGENTS.md", fmt.Sprintf("round %d\n", round))
		write(fmt.Sprintf(".agents/skills/s%d/SKILL.md", round), fmt.Sprintf("---\ndescription: skill of round %d.\n---\nbody\n", round))
		var wg sync.WaitGroup
		for i := range 16 {
			cwd := h.Workspace
			if i%2 == 1 {
				cwd = filepath.Join(h.Workspace, "sub")
			}
			wg.Go(func() {
				r, err := w.Context(t.Context(), cwd, "", nil)
				if err != nil {
					t.Error(err)
					return
				}
				var text []string
				for _, f := range r.GetInstructions() {
					text = append(text, f.GetContent())
				}
				all := strings.Join(text, "")
				if !strings.Contains(all, fmt.Sprintf("round %d\n", round)) || strings.Contains(all, "sub rules") != (i%2 == 1) {
					t.Errorf("round %d, cwd %s: instructions %q", round, cwd, all)
				}
				if n := len(r.GetSkills()); n != round || r.GetSkills()[n-1].GetName() != fmt.Sprintf("s%d", round) {
					t.Errorf("round %d: skills %v", round, r.GetSkills())
				}
			})
		}
		wg.Wait()
	}
}

// TestWorkspaceReadsKeyOnTheRoot: reads of one cwd within different
// session roots are never shared: each is its own call, sent with its root,
// and each caller gets the answer read within its own root (sharing by
// cwd alone would hand a session of ws/a the context of the host's root).
func TestWorkspaceReadsKeyOnTheRoot(t *testing.T) {
	t.Parallel()
	g := newGatedHost("x")
	w := &Workspaces{Hosts: []Host{{"h", g}}}
	roots := []string{"", "/w", "/w/a"}
	got := make(chan [2]string, len(roots))
	for _, root := range roots {
		go func() {
			r, err := w.Context(t.Context(), "/w/a", root, nil)
			if err != nil {
				t.Error(err)
			}
			got <- [2]string{root, r.GetProjectRoot()}
		}()
	}
	for range roots {
		select {
		case <-g.started:
		case <-time.After(30 * time.Second): // a failure bound, not a synchronisation
			t.Fatal("reads within different roots were not each their own call")
		}
	}
	close(g.release)
	for range roots {
		if r := <-got; r[0] != r[1] {
			t.Errorf("a read within root %q got the answer read within %q", r[0], r[1])
		}
	}
}

// TestWorkspaceHostsReadTogether: a turn start asks every visible host at
// once (it waits for the slowest, not the sum) and still merges in host
// order whichever answers first.
func TestWorkspaceHostsReadTogether(t *testing.T) {
	t.Parallel()
	a, b := newGatedHost("from a"), newGatedHost("from b")
	w := &Workspaces{Hosts: []Host{{"a", a}, {"b", b}}}
	got := make(chan *toolsv1.GetWorkspaceContextResponse, 1)
	go func() {
		r, err := w.Context(t.Context(), "/w", "", nil)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	for _, g := range []*gatedHost{a, b} {
		select {
		case <-g.started:
		case <-time.After(30 * time.Second): // a failure bound, not a synchronisation
			t.Fatal("a host was not asked while the other had not answered")
		}
	}
	close(b.release)
	close(a.release)
	r := <-got
	if len(r.GetInstructions()) != 2 || r.GetInstructions()[0].GetContent() != "from a" || r.GetVersion() != "a:from a,b:from b" {
		t.Errorf("merged %v", r)
	}
}

// hungHost never answers until the test ends, whatever the call's deadline.
type hungHost struct {
	calls atomic.Int32
	gone  chan struct{}
}

func (h *hungHost) GetWorkspaceContext(context.Context, *toolsv1.GetWorkspaceContextRequest, ...grpc.CallOption) (*toolsv1.GetWorkspaceContextResponse, error) {
	h.calls.Add(1)
	<-h.gone
	return nil, errors.New("test over")
}

// TestWorkspaceReadWaitBounded: a caller's wait is bounded (by its own
// read's timeout, twice the host timeout at most) even when it joined
// behind a read that never ends; a hung host is a
// notice, never a stuck turn.
func TestWorkspaceReadWaitBounded(t *testing.T) {
	t.Parallel()
	h := &hungHost{gone: make(chan struct{})}
	t.Cleanup(func() { close(h.gone) })
	w := &Workspaces{Hosts: []Host{{"hung", h}}, Timeout: 50 * time.Millisecond}
	done := make(chan *toolsv1.GetWorkspaceContextResponse, 2)
	for range 2 {
		go func() {
			r, err := w.Context(t.Context(), "/w", "", nil)
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
	}
	for range 2 {
		select {
		case r := <-done:
			if len(r.GetNotices()) != 1 || !strings.Contains(r.GetNotices()[0].GetMessage(), "deadline exceeded") || r.GetVersion() != "hung:error" {
				t.Errorf("answer %v", r)
			}
		case <-time.After(30 * time.Second): // a failure bound, not a synchronisation
			t.Fatal("a caller waited past its timeout")
		}
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("%d calls: the second caller waits for the next read, which starts only after the first ends", n)
	}
}

// slowHost answers every read after delay (its latency, not a
// synchronisation), signalling each call's start.
type slowHost struct {
	delay   time.Duration
	started chan struct{}
}

func (h *slowHost) GetWorkspaceContext(context.Context, *toolsv1.GetWorkspaceContextRequest, ...grpc.CallOption) (*toolsv1.GetWorkspaceContextResponse, error) {
	h.started <- struct{}{}
	time.Sleep(h.delay)
	return &toolsv1.GetWorkspaceContextResponse{}, nil
}

// TestWorkspaceReadSlowHostLateCaller: a host that answers within its
// timeout (0.7 s of 1 s) answers a caller that joined while a read was in
// flight too, although the caller's own read ends 1.4 s after it asked.
func TestWorkspaceReadSlowHostLateCaller(t *testing.T) {
	t.Parallel()
	h := &slowHost{delay: 700 * time.Millisecond, started: make(chan struct{}, 2)}
	w := &Workspaces{Hosts: []Host{{"slow", h}}, Timeout: time.Second}
	first := make(chan error, 1)
	go func() { _, err := w.Context(t.Context(), "/w", "", nil); first <- err }()
	<-h.started // the first read is in flight: the next caller queues behind it
	r, err := w.Context(t.Context(), "/w", "", nil)
	if err != nil || len(r.GetNotices()) != 0 {
		t.Errorf("the late caller: %v, notices %v; want the host's answer", err, r.GetNotices())
	}
	if err := <-first; err != nil {
		t.Error(err)
	}
}
