// Package buildinfo says which build a dsh binary is, for every binary's
// --version: the module version (or the -ldflags "-X" override), the VCS
// revision and time the go command stamped, and the Go version.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time with -ldflags "-X
// github.com/dsh-dev/dsh/internal/buildinfo.Version=v1.2.3"; empty means
// "the module version the go command recorded, or (devel)".
var Version string

// String is the one-line description printed by --version, e.g.
// "agent v0.3.0 (rev 1a2b3c4d5e6f, 2026-12-01T12:00:00Z, modified) go1.26.8 linux/amd64".
func String(binary string) string {
	v, rev, when, dirty := Version, "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	out := binary + " " + v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += " (rev " + rev
		if when != "" {
			out += ", " + when
		}
		if dirty {
			out += ", modified"
		}
		out += ")"
	}
	return fmt.Sprintf("%s %s %s/%s", out, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// FlagUsage is the help line of every binary's --version flag.
const FlagUsage = "print the version and exit"

// Requested reports whether args ask for the version: -version or
// --version (or =true) anywhere before a "--" terminator. Binaries check it
// before parsing the rest, so --version works with any other arguments.
func Requested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-version", "--version", "-version=true", "--version=true":
			return true
		}
	}
	return false
}
