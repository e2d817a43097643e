//go:build linux

// Package swaptest stages, for tests only, the attack the file tools'
// confinement (internal/fileopen and its callers) must withstand: a
// directory inside a workspace that a session's own shell replaces with a
// symbolic link to elsewhere, atomically — renameat2(RENAME_EXCHANGE)
// swaps the directory's name with a link's, so no observer ever sees the
// name missing — once between a check and its use (Swap), or back and
// forth as fast as the kernel allows while tools run (Flip).
package swaptest

import (
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Swap makes a symbolic link to target at alt and exchanges the names dir
// and alt: afterwards dir is the link and alt the directory. Any failure
// fails the test at once.
func Swap(t testing.TB, dir, alt, target string) {
	t.Helper()
	link(t, alt, target)
	if err := exchange(dir, alt); err != nil {
		t.Fatal(err)
	}
}

// Flip makes a symbolic link to target at alt and exchanges the names dir
// and alt over and over, without pause, until stop is called; stop waits
// for the last exchange, after which dir and alt may be either way round
// (the test's cleanup also stops it). A failed exchange fails the test.
func Flip(t testing.TB, dir, alt, target string) (stop func()) {
	t.Helper()
	link(t, alt, target)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := exchange(dir, alt); err != nil {
				t.Errorf("swaptest: %v", err)
				return
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func link(t testing.TB, alt, target string) {
	t.Helper()
	if err := os.Symlink(target, alt); err != nil {
		t.Fatal(err)
	}
}

func exchange(a, b string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
	}
	return nil
}
