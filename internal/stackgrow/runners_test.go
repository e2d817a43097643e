package stackgrow

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// deep uses about n*300 bytes of stack.
//
//go:noinline
func deep(n int) byte {
	var pad [256]byte
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%256]
}

// TestRunnersKeepTheirStacks: runners that served a call needing ~10 KiB of
// stack and went idle still hold 16 KiB each after two collections (which
// halve the stack of an idle goroutine using under a quarter of it), and a
// second round of calls grows no stack: the process's stack memory stays
// as it was.
func TestRunnersKeepTheirStacks(t *testing.T) {
	const n = 128
	p := NewRunners(n, time.Hour)
	round := func() {
		var wg, all sync.WaitGroup
		all.Add(n)
		for range n {
			wg.Go(func() {
				p.Run(func() {
					deep(32)
					// hold the runner until every call has one
					all.Done()
					all.Wait()
				})
			})
		}
		wg.Wait()
	}
	round()
	if got := p.idleCount(); got != n {
		t.Fatalf("%d idle runners, want %d", got, n)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	// the runners are idle: 16 KiB each, on top of the rest of the process
	if before.StackInuse < n*16<<10 {
		t.Fatalf("stack in use %d after collections, want at least %d (16 KiB per idle runner)", before.StackInuse, n*16<<10)
	}
	round()
	if got := p.idleCount(); got != n {
		t.Fatalf("%d idle runners after the second round, want %d (reused)", got, n)
	}
	runtime.ReadMemStats(&after)
	t.Logf("stack in use: %d, then %d", before.StackInuse, after.StackInuse)
}

// TestRunnersShrink: beyond maxIdle a runner is not kept, and runners idle
// longer than idleFor are retired as the pool is used.
func TestRunnersShrink(t *testing.T) {
	p := NewRunners(2, time.Hour)
	var wg, all sync.WaitGroup
	all.Add(5)
	for range 5 {
		wg.Go(func() { p.Run(func() { all.Done(); all.Wait() }) })
	}
	wg.Wait()
	if got := p.idleCount(); got != 2 {
		t.Fatalf("%d idle runners, want 2 (maxIdle)", got)
	}
	p.idleFor = -1 // every idle runner has been idle too long
	p.Run(func() {})
	if got := p.idleCount(); got != 1 {
		t.Fatalf("%d idle runners after a call with idleFor -1, want 1 (the one just used)", got)
	}
}

// TestRunPanics: a call's panic is raised again in Run's caller, with the
// runner's stack, and the runner serves the next call; a call that exits
// its goroutine makes Run panic instead of waiting forever.
func TestRunPanics(t *testing.T) {
	p := NewRunners(4, time.Hour)
	boom := errors.New("boom")
	catch := func(f func()) (v any) {
		defer func() { v = recover() }()
		p.Run(f)
		return nil
	}
	v := catch(func() { panic(boom) })
	pv, ok := v.(*Panic)
	if !ok || pv.Value != boom || !strings.Contains(string(pv.Stack), "TestRunPanics") {
		t.Fatalf("recovered %#v, want a *Panic of boom with the call's stack", v)
	}
	ran := false
	if v := catch(func() { ran = true }); v != nil || !ran {
		t.Fatalf("after a panic: recovered %v, ran %v", v, ran)
	}
	if got := p.idleCount(); got != 1 {
		t.Fatalf("%d idle runners, want 1 (reused after the panic)", got)
	}
	if v := catch(runtime.Goexit); v != errGoexit {
		t.Fatalf("Goexit: recovered %v, want errGoexit", v)
	}
	if got := p.idleCount(); got != 0 {
		t.Fatalf("%d idle runners after a Goexit, want 0 (that runner is gone)", got)
	}
}

func (p *Runners) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}
