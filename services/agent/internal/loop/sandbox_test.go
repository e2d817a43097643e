package loop

import (
	"testing"

	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
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
