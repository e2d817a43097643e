package bash

import (
	"fmt"
	"strings"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox"
)

// denialSignatures are the stderr texts a Landlock denial produces (EACCES
// on open, EXDEV on a link or rename across the fence).
var denialSignatures = []string{"permission denied", "invalid cross-device link"}

// netSignatures are what a network-off call sees (an empty namespace, or
// Landlock's EACCES on connect).
var netSignatures = []string{"network is unreachable", "could not resolve host", "temporary failure in name resolution"}

// markers appends the sandbox and limit markers of semantics.md §7.2 and
// reports whether a denial was seen.
func (s *Shell) markers(b *strings.Builder, p sandbox.Policy, r RunResult) bool {
	stderr := strings.ToLower(r.Stderr.Text)
	denied := false
	if p.Mode.Confined() && containsAny(stderr, denialSignatures) {
		fmt.Fprintf(b, "\n[sandbox: file access denied under %s mode]", p.Mode)
		denied = true
	}
	if !p.Network && containsAny(stderr, netSignatures) {
		b.WriteString("\n[sandbox: network access is off for this session]")
		denied = true
	}
	l := s.x.Limits
	if r.Signal == "SIGXCPU" || strings.Contains(stderr, "cpu time limit exceeded") {
		fmt.Fprintf(b, "\n[limit: CPU time of %ds per process exceeded]", l.CPUSeconds)
	}
	if r.Signal == "SIGXFSZ" || strings.Contains(stderr, "file size limit exceeded") {
		fmt.Fprintf(b, "\n[limit: file size of %d bytes exceeded]", l.FileBytes)
	}
	if strings.Contains(stderr, "resource temporarily unavailable") || strings.Contains(stderr, "cannot fork") {
		fmt.Fprintf(b, "\n[limit: process count of %d reached]", l.Processes)
	}
	if strings.Contains(stderr, "cannot allocate memory") || strings.Contains(stderr, "memoryerror") || strings.Contains(stderr, "out of memory") {
		fmt.Fprintf(b, "\n[limit: memory of %d bytes per process reached]", l.MemoryBytes)
	}
	return denied
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func enforcementName(e toolsv1.SandboxEnforcement) string {
	switch e {
	case toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_FULL:
		return "full"
	case toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_PARTIAL:
		return "partial"
	}
	return "none"
}
