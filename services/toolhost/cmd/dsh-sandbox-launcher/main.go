// Command dsh-sandbox-launcher is the confined-call launcher as its own small
// binary. The toolhost runs it (when it lies next to the toolhost's binary)
// instead of re-executing its own, much larger, binary for every bash call:
// a Go runtime start costs in proportion to the binary (its function table
// is verified and paged in), so the small binary starts several
// milliseconds faster. The work is the launcher package's, whose init
// takes over when argv[0] is its marker; run any other way this only says
// what it is.
package main

import (
	"fmt"
	"os"

	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"
)

func main() {
	fmt.Fprintf(os.Stderr, "%s: the dsh toolhost's sandbox launcher; the toolhost runs it with argv[0] %q, it is not run by hand\n", os.Args[0], launcher.Arg0)
	os.Exit(2)
}
