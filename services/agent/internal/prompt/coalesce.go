package prompt

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// reads coalesces concurrent workspace reads of one (host, cwd, workspace
// root): many
// sessions starting turns at once (or being created in one directory)
// share GetWorkspaceContext calls instead of each making its own.
//
// A caller never gets an answer older than its own request: it shares only
// a read that starts after it asked. While a read is in flight, callers
// join the next one, which starts when the current one ends; so a burst of
// N callers costs at most two reads per host and cwd, and an instruction
// file edited before a turn started is always seen by that turn.
type reads struct {
	mu      sync.Mutex
	pending map[readKey]*readState
}

// readKey is what a read asks: a context read within one root is not
// another root's.
type readKey struct{ host, cwd, root string }

// readState is one key's reads: the one in flight and the one its late
// callers wait for.
type readState struct {
	running, next *flight
}

// flight is one GetWorkspaceContext call and its answer, shared read-only
// by every caller that joined it.
type flight struct {
	ctx     context.Context // the first caller's values (trace), not its cancellation
	started time.Time       // when its call began (under reads.mu; zero while it waits its turn)
	done    chan struct{}
	callers int // joined so far (under reads.mu)
	resp    *toolsv1.GetWorkspaceContextResponse
	err     error
}

// share is a caller's place in a flight: the read and how long the caller
// waits for it.
type share struct {
	f        *flight
	deadline time.Time
}

// join returns the read k of h that the caller shares: one that
// starts after this call. The caller waits for it as long as the call
// itself may take (timeout) from when it starts — for a read queued behind
// the one in flight, that is after the running one's own timeout at the
// latest.
func (r *reads) join(ctx context.Context, h Host, k readKey, timeout time.Duration) share {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = map[readKey]*readState{}
	}
	st := r.pending[k]
	var f *flight
	switch {
	case st == nil:
		f = newFlight(ctx)
		f.started = now
		r.pending[k] = &readState{running: f}
		go r.run(k, h, timeout, f)
		return r.joined(f, now.Add(timeout))
	case st.next != nil:
		f = st.next
	default:
		f = newFlight(ctx)
		st.next = f
	}
	return r.joined(f, st.running.started.Add(2*timeout))
}

// joined counts a caller of f (under r.mu).
func (r *reads) joined(f *flight, deadline time.Time) share {
	f.callers++
	return share{f, deadline}
}

// wait returns the flight's answer; ctx's error when ctx ends first; or
// DEADLINE_EXCEEDED, as the call itself would end, when the share's
// deadline passes first — a caller waits at most its call's timeout (twice
// it when queued behind a read in flight), even behind a read that hangs.
// The read itself goes on for the other callers, bounded by its own
// timeout.
func (sh share) wait(ctx context.Context) (*toolsv1.GetWorkspaceContextResponse, error) {
	f := sh.f
	select {
	case <-f.done:
		return f.resp, f.err
	default:
	}
	t := time.NewTimer(time.Until(sh.deadline))
	defer t.Stop()
	select {
	case <-f.done:
		return f.resp, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, status.FromContextError(context.DeadlineExceeded).Err()
	}
}

func newFlight(ctx context.Context) *flight {
	return &flight{ctx: context.WithoutCancel(ctx), done: make(chan struct{})}
}

// run makes f's call, then starts the read its late callers joined, if
// any, or forgets the key.
func (r *reads) run(k readKey, h Host, timeout time.Duration, f *flight) {
	for f != nil {
		cctx, cancel := context.WithTimeout(f.ctx, timeout)
		f.resp, f.err = h.Client.GetWorkspaceContext(cctx, &toolsv1.GetWorkspaceContextRequest{Cwd: k.cwd, WorkspaceRoot: k.root})
		cancel()
		close(f.done)
		r.mu.Lock()
		st := r.pending[k]
		f, st.running, st.next = st.next, st.next, nil
		if f == nil {
			delete(r.pending, k)
		} else {
			f.started = time.Now()
		}
		r.mu.Unlock()
	}
}
