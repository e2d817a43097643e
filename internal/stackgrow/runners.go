package stackgrow

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// Runners runs calls on goroutines whose stacks stay grown between calls.
//
// To16KiB still pays, on every goroutine it runs on, for a 16 KiB stack
// the goroutine did not have: a new stack (from the runtime's pools, or
// fresh memory whose pages fault in as the copy and the frame's zeroing
// first touch them) and the copy. A goroutine made per unit of work pays
// it every time; so does a pooled one, because the collector halves the
// stack of a goroutine that uses under a quarter of it, and an idle worker
// parked in a shallow loop does. At 1,000 `read` sessions that was the
// gateway's largest single item (docs/arch/throughput.md §26).
//
// A runner parks inside a frame of a quarter of its 16 KiB stack, so the
// collector never finds it using less than a quarter and never shrinks it:
// a call handed to an idle runner starts on a stack that is already grown
// and already resident. The caller waits for the call (one hand-off each
// way), and a panic in the call is raised again in the caller, with the
// runner's stack in its value, so a recover there sees it as before.
//
// At most maxIdle runners wait; a runner idle longer than idleFor is
// retired when the pool is next used, so the stacks a burst left behind
// go back to the runtime once the burst is over.
type Runners struct {
	maxIdle int
	idleFor time.Duration

	mu   sync.Mutex
	idle []*runner // the most recently used last
}

// NewRunners returns a pool that keeps at most maxIdle idle runners, each
// for at most idleFor.
func NewRunners(maxIdle int, idleFor time.Duration) *Runners {
	return &Runners{maxIdle: maxIdle, idleFor: idleFor}
}

type runner struct {
	call  chan func()
	done  chan any // the call's panic value, or nil
	since time.Time
}

// Panic is a panic raised in a call Run made, raised again in Run's caller.
type Panic struct {
	Value any
	Stack []byte // the runner's stack where the call panicked
}

func (p *Panic) Error() string { return fmt.Sprintf("%v\n\n%s", p.Value, p.Stack) }

// Run calls f on a runner and returns when f has returned.
func (p *Runners) Run(f func()) {
	r := p.get()
	r.call <- f
	switch v := <-r.done; v {
	case nil:
		p.put(r)
	case errGoexit:
		// The runner's goroutine has exited with the call.
		panic(v)
	default:
		// A runner whose call panicked has unwound to its loop and is
		// fine to reuse.
		p.put(r)
		panic(v)
	}
}

// errGoexit is what Run panics with when f called runtime.Goexit.
var errGoexit = errors.New("stackgrow: a call run on a runner exited its goroutine")

func (p *Runners) get() *runner {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		r := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return r
	}
	p.mu.Unlock()
	r := &runner{call: make(chan func()), done: make(chan any)}
	go r.loop()
	return r
}

func (p *Runners) put(r *runner) {
	now := time.Now()
	r.since = now
	p.mu.Lock()
	// The longest idle are first; retire those idle too long (at most two
	// per call: the pool shrinks as it is used, never in one long pause).
	var retire [2]*runner
	n := 0
	for n < len(retire) && len(p.idle) > 0 && now.Sub(p.idle[0].since) > p.idleFor {
		retire[n] = p.idle[0]
		p.idle[0] = nil
		p.idle = p.idle[1:]
		n++
	}
	keep := len(p.idle) < p.maxIdle
	if keep {
		p.idle = append(p.idle, r)
	}
	p.mu.Unlock()
	for _, old := range retire[:n] {
		close(old.call)
	}
	if !keep {
		close(r.call)
	}
}

// parked is the frame a runner waits in: a quarter of a 16 KiB stack, so
// the collector's shrinking (which halves a stack using under a quarter of
// it) leaves the runner's stack as it is.
const parked = 4<<10 + 256

// loop grows the runner's stack to 16 KiB once, then serves calls on top
// of its frame until retired.
//
//go:noinline
func (r *runner) loop() byte {
	var pad [parked]byte
	To16KiB()
	r.serve()
	return pad[len(r.done)]
}

// serve runs calls and reports how each ended.
//
//go:noinline
func (r *runner) serve() {
	for f := range r.call {
		r.done <- r.run(f)
	}
}

// run runs f and returns what it panicked with, or nil. If f exits the
// goroutine (runtime.Goexit), run reports errGoexit before it goes.
func (r *runner) run(f func()) (v any) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if x := recover(); x != nil {
			v = &Panic{Value: x, Stack: debug.Stack()}
			return
		}
		r.done <- errGoexit
	}()
	f()
	returned = true
	return nil
}
