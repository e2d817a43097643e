package loop

import (
	"testing"

	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

func TestMergeSandbox(t *testing.T) {
	t.Parallel()
	ro, ww := toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY, toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE
	on, off := toolsv1.NetworkAccess_NETWORK_ACCESS_ON, toolsv1.NetworkAccess_NETWORK_ACCESS_OFF
	def := &toolsv1.SandboxPolicy{Mode: ww, Network: on}
	tests := []struct {
		name          string
		event, header *toolsv1.SandboxPolicy
		want          *toolsv1.SandboxPolicy
	}{
		{"default only", nil, nil, def},
		{"header overrides mode", nil, &toolsv1.SandboxPolicy{Mode: ro}, &toolsv1.SandboxPolicy{Mode: ro, Network: on}},
		{"event overrides header", &toolsv1.SandboxPolicy{Mode: ww}, &toolsv1.SandboxPolicy{Mode: ro, Network: off}, &toolsv1.SandboxPolicy{Mode: ww, Network: off}},
		{"event network only", &toolsv1.SandboxPolicy{Network: off}, nil, &toolsv1.SandboxPolicy{Mode: ww, Network: off}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, MergeSandbox(tc.event, tc.header, def), protocmp.Transform()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	if got := MergeSandbox(nil, nil, nil); got != nil {
		t.Errorf("no layer: %v, want nil (hosts apply their own default)", got)
	}
}

// TestEffectiveSandboxFollowsTheLog: the policy sent with a call is the
// last sandbox/mode event's, over the header's options, over the
// deployment default, and the fold picks up events appended later.
func TestEffectiveSandboxFollowsTheLog(t *testing.T) {
	t.Parallel()
	ro := &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY}
	h := &sessionv1.SessionHeader{Id: "s", Options: &sessionv1.SessionOptions{Provider: "p", Model: "m", Sandbox: ro}}
	log, err := session.NewLog(h, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE, Network: toolsv1.NetworkAccess_NETWORK_ACCESS_ON}
	a := New(Config{Sandbox: def}, log)
	want := &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY, Network: toolsv1.NetworkAccess_NETWORK_ACCESS_ON}
	if diff := cmp.Diff(want, a.effectiveSandbox(), protocmp.Transform()); diff != "" {
		t.Errorf("from the header (-want +got):\n%s", diff)
	}
	for _, ev := range []*sessionv1.SessionEvent{
		session.TurnStartEvent(1, session.MessageTrigger(session.UserSource())),
		{Payload: &sessionv1.SessionEvent_SandboxMode{SandboxMode: &sessionv1.SandboxModeChanged{Sandbox: &toolsv1.SandboxPolicy{
			Mode: toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS, Network: toolsv1.NetworkAccess_NETWORK_ACCESS_OFF}}}},
	} {
		if _, err := log.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	want = &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS, Network: toolsv1.NetworkAccess_NETWORK_ACCESS_OFF}
	if diff := cmp.Diff(want, a.effectiveSandbox(), protocmp.Transform()); diff != "" {
		t.Errorf("after sandbox/mode (-want +got):\n%s", diff)
	}
	if a.sandbox.next != log.Len() {
		t.Errorf("fold cursor %d, log length %d: the next call must only read new events", a.sandbox.next, log.Len())
	}
}
