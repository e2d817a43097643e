// Package sandbox confines the processes a tool call starts and answers the
// same policy for in-process file tools (semantics.md §7.2).
//
// A confined bash call runs through a launcher: the toolhost's own binary
// re-executed with a marker argv[0] (see the init hook in child.go, so both
// the toolhost binary and `dsh dev` serve it). The launcher starts as pid 1
// of a fresh PID and mount namespace (and network namespace when network is
// off), mounts its own /proc, joins the call's pids cgroup, sets rlimits,
// drops dangerous capabilities, enforces the Landlock ruleset this package
// built for the call (go-landlock, best ABI; see landlock.go), then starts
// the shell and waits. When the shell exits the launcher exits,
// and the kernel kills every process left in the namespace (setsid, nohup,
// double fork included) before the toolhost sees the exit.
//
// Modes: read-only reads everywhere except other sessions' workspaces and
// spill directories, and writes only /dev/null and co.; workspace-write adds
// the session's workspace root and the call's temporary directory (its
// ruleset's, emptied between the calls it serves: pool.go);
// danger-full-access skips Landlock and the capability drop but keeps the
// namespaces and limits (containment is not a file effect).
//
// Fail closed: a confined mode without a usable Landlock ABI, or a launcher
// that cannot set itself up, is ErrUnavailable (SANDBOX_UNAVAILABLE for the
// model), never an unconfined run.
package sandbox

import (
	"errors"
	"fmt"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Mode is a file-effect confinement mode.
type Mode string

// The modes of semantics.md §7.2.
const (
	ReadOnly         Mode = "read-only"
	WorkspaceWrite   Mode = "workspace-write"
	DangerFullAccess Mode = "danger-full-access"
)

// ParseMode parses a mode flag value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ReadOnly, WorkspaceWrite, DangerFullAccess:
		return m, nil
	}
	return "", fmt.Errorf("sandbox mode %q: want read-only, workspace-write or danger-full-access", s)
}

// Confined reports whether the mode confines file effects.
func (m Mode) Confined() bool { return m != DangerFullAccess }

// ModeFromProto maps the wire enum; UNSPECIFIED is "".
func ModeFromProto(m toolsv1.SandboxMode) Mode {
	switch m {
	case toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY:
		return ReadOnly
	case toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE:
		return WorkspaceWrite
	case toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS:
		return DangerFullAccess
	}
	return ""
}

// Proto maps a mode to the wire enum.
func (m Mode) Proto() toolsv1.SandboxMode {
	switch m {
	case ReadOnly:
		return toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY
	case WorkspaceWrite:
		return toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE
	case DangerFullAccess:
		return toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS
	}
	return toolsv1.SandboxMode_SANDBOX_MODE_UNSPECIFIED
}

// Policy is one call's effective confinement.
type Policy struct {
	Mode Mode
	// Network says whether tool processes may use the network.
	Network bool
}

// FromProto resolves a call's policy; unset fields take def's.
func FromProto(p *toolsv1.SandboxPolicy, def Policy) Policy {
	out := def
	if m := ModeFromProto(p.GetMode()); m != "" {
		out.Mode = m
	}
	switch p.GetNetwork() {
	case toolsv1.NetworkAccess_NETWORK_ACCESS_ON:
		out.Network = true
	case toolsv1.NetworkAccess_NETWORK_ACCESS_OFF:
		out.Network = false
	}
	return out
}

// String is "mode, network on|off".
func (p Policy) String() string {
	n := "on"
	if !p.Network {
		n = "off"
	}
	return fmt.Sprintf("%s, network %s", p.Mode, n)
}

// ErrUnavailable is the fail-closed refusal: the policy is confined and no
// usable backend can enforce it.
var ErrUnavailable = errors.New("sandbox unavailable")

// Effective is one call's resolved confinement.
type Effective struct {
	Policy
	// Root is the session's real workspace root.
	Root string
	// SpillDir is the session's own spill directory.
	SpillDir string
}

// ParseNetwork parses a network flag value ("on" or "off") and reports
// whether the network is off.
func ParseNetwork(s string) (off bool, err error) {
	switch s {
	case "on":
		return false, nil
	case "off":
		return true, nil
	}
	return false, fmt.Errorf("network %q: want on or off", s)
}
