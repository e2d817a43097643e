package loop

import (
	"google.golang.org/protobuf/proto"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// sandboxFold is the incremental fold behind effectiveSandbox: the events
// already looked at and the last sandbox/mode seen. It runs on the driver
// only and reads each event once, so a tool call costs the events appended
// since the previous batch, not the whole log.
type sandboxFold struct {
	next int64
	last *toolsv1.SandboxPolicy
}

// effectiveSandbox resolves the policy sent with every call (semantics.md
// §7.2), field by field: the last sandbox/mode event, else the session's
// options, else the deployment default. The result always has both fields
// set when the default does.
func (a *Agent) effectiveSandbox() *toolsv1.SandboxPolicy {
	for _, ev := range a.log.EventsFrom(a.sandbox.next) {
		if m := ev.GetSandboxMode(); m != nil {
			a.sandbox.last = m.GetSandbox()
		}
		a.sandbox.next = ev.GetSeq() + 1
	}
	return MergeSandbox(a.sandbox.last, a.h.GetOptions().GetSandbox(), a.cfg.Sandbox)
}

// MergeSandbox takes each field from the first layer that sets it.
func MergeSandbox(layers ...*toolsv1.SandboxPolicy) *toolsv1.SandboxPolicy {
	out := &toolsv1.SandboxPolicy{}
	for _, l := range layers {
		if out.Mode == toolsv1.SandboxMode_SANDBOX_MODE_UNSPECIFIED {
			out.Mode = l.GetMode()
		}
		if out.Network == toolsv1.NetworkAccess_NETWORK_ACCESS_UNSPECIFIED {
			out.Network = l.GetNetwork()
		}
	}
	if proto.Equal(out, &toolsv1.SandboxPolicy{}) {
		return nil
	}
	return out
}
