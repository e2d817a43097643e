// Command dsh-sandbox-launcher is the confined-call launcher as its own small
// binary. The toolhost runs it (when it lies next to the toolhost's binary)
// instead of re-executing its own, much larger, binary for every bash call.
//
// Built with cgo (make build, the Dockerfile), a call is served by a C first
// stage (launch.c) from a constructor that runs before the Go runtime
// starts: the Go runtime's start was about half of what a call cost the
// launcher (docs/arch/throughput.md §18). Built without cgo, the launcher
// package's init serves it, after the Go runtime started. Either way the
// protocol is the launcher package's; run any other way this only says
// what it is.
package main

import (
	"fmt"
	"os"

	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"
)

func main() {
	fmt.Fprintf(os.Stderr, "%s: the dsh toolhost's sandbox launcher (first stage: %s); the toolhost runs it with argv[0] %q, it is not run by hand\n", os.Args[0], firstStage, launcher.Arg0)
	os.Exit(2)
}
