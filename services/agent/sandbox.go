package agent

import (
	"fmt"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// ParseSandbox turns the --sandbox-mode and --sandbox-network flag values
// into the deployment default policy.
func ParseSandbox(mode, network string) (*toolsv1.SandboxPolicy, error) {
	p := &toolsv1.SandboxPolicy{}
	switch mode {
	case "read-only":
		p.Mode = toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY
	case "workspace-write":
		p.Mode = toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE
	case "danger-full-access":
		p.Mode = toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS
	default:
		return nil, fmt.Errorf("sandbox mode %q: want read-only, workspace-write or danger-full-access", mode)
	}
	switch network {
	case "on":
		p.Network = toolsv1.NetworkAccess_NETWORK_ACCESS_ON
	case "off":
		p.Network = toolsv1.NetworkAccess_NETWORK_ACCESS_OFF
	default:
		return nil, fmt.Errorf("sandbox network %q: want on or off", network)
	}
	return p, nil
}
