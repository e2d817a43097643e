package prompt

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// reads coalesces concurrent workspace reads of one (host, cwd): many
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

type readKey struct{ host, cwd string }

// readState is one key's reads: the one in flight and the one its late
// callers wait for.
type readState struct {
	running, next *flight
}

// flight is one GetWorkspaceContext call and its answer, shared read-only
// by every caller that joined it.
type flight struct {
	ctx     context.Context // the first caller's values (trace), not its cancellation
	done    chan struct{}
	callers int // joined so far (under reads.mu)
	resp    *toolsv1.GetWorkspaceContextResponse
	err     error
}

// join returns the read of h for cwd that the caller shares: one that
// starts after this call.
func (r *reads) join(ctx context.Context, h Host, cwd string, timeout time.Duration) *flight {
	k := readKey{h.Name, cwd}
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
		r.pending[k] = &readState{running: f}
		go r.run(k, h, cwd, timeout, f)
	case st.next != nil:
		f = st.next
	default:
		f = newFlight(ctx)
		st.next = f
	}
	f.callers++
	return f
}

// wait returns f's answer; ctx's error when ctx ends first; or
// DEADLINE_EXCEEDED, as the call itself would end, when timeout passes
// first — a caller waits at most timeout, even when it joined behind a
// read that hangs. The read itself goes on for the other callers, bounded
// by its own timeout.
func (f *flight) wait(ctx context.Context, timeout time.Duration) (*toolsv1.GetWorkspaceContextResponse, error) {
	select {
	case <-f.done:
		return f.resp, f.err
	default:
	}
	t := time.NewTimer(timeout)
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
func (r *reads) run(k readKey, h Host, cwd string, timeout time.Duration, f *flight) {
	for f != nil {
		cctx, cancel := context.WithTimeout(f.ctx, timeout)
		f.resp, f.err = h.Client.GetWorkspaceContext(cctx, &toolsv1.GetWorkspaceContextRequest{Cwd: cwd})
		cancel()
		close(f.done)
		r.mu.Lock()
		st := r.pending[k]
		f, st.running, st.next = st.next, st.next, nil
		if f == nil {
			delete(r.pending, k)
		}
		r.mu.Unlock()
	}
}
