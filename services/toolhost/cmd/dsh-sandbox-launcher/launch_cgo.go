//go:build cgo

package main

// #cgo CFLAGS: -O2 -Wall -Wextra
// #cgo LDFLAGS: -static
// int dsh_cloexec_walk(void);
import "C"

import "syscall"

// cloexecWalk is launch.c's fallback for kernels without
// CLOSE_RANGE_CLOEXEC, for the tests.
func cloexecWalk() error {
	if e := C.dsh_cloexec_walk(); e != 0 {
		return syscall.Errno(e)
	}
	return nil
}

// firstStage says the C first stage (launch.c) is in this build: it serves
// a call from a constructor before the Go runtime starts.
const firstStage = "c"
