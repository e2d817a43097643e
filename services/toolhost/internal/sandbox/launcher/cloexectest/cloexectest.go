// Package cloexectest checks a launcher's fallback for kernels whose
// close_range lacks CLOSE_RANGE_CLOEXEC (before 5.11): the walk of
// /proc/self/fd that marks every descriptor above 2 close-on-exec. Both
// first stages (the Go launcher, launch.c) are held to it.
package cloexectest

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Check opens descriptors without close-on-exec (one of them high, as an
// inherited one may be), runs walk, and checks each is close-on-exec now
// and that standard input was left alone.
func Check(t *testing.T, walk func() error) {
	t.Helper()
	fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	high := 200
	if err := unix.Dup2(fd, high); err != nil { // dup2 leaves close-on-exec off
		t.Fatal(err)
	}
	defer unix.Close(high)
	stdin, err := unix.FcntlInt(0, unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []int{fd, high} {
		if f, _ := unix.FcntlInt(uintptr(d), unix.F_GETFD, 0); f&unix.FD_CLOEXEC != 0 {
			t.Fatalf("descriptor %d is close-on-exec before the walk", d)
		}
	}
	if err := walk(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []int{fd, high} {
		if f, err := unix.FcntlInt(uintptr(d), unix.F_GETFD, 0); err != nil || f&unix.FD_CLOEXEC == 0 {
			t.Errorf("descriptor %d: flags %#x (%v), want close-on-exec", d, f, err)
		}
	}
	if f, _ := unix.FcntlInt(0, unix.F_GETFD, 0); f != stdin {
		t.Errorf("standard input's flags changed: %#x, were %#x", f, stdin)
	}
}
