package sandbox

import (
	"slices"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func TestFromProto(t *testing.T) {
	t.Parallel()
	def := Policy{Mode: WorkspaceWrite, Network: true}
	tests := []struct {
		in   *toolsv1.SandboxPolicy
		want Policy
	}{
		{nil, def},
		{&toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY}, Policy{Mode: ReadOnly, Network: true}},
		{&toolsv1.SandboxPolicy{Network: toolsv1.NetworkAccess_NETWORK_ACCESS_OFF}, Policy{Mode: WorkspaceWrite}},
		{&toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS, Network: toolsv1.NetworkAccess_NETWORK_ACCESS_ON}, Policy{Mode: DangerFullAccess, Network: true}},
	}
	for _, tc := range tests {
		if got := FromProto(tc.in, def); got != tc.want {
			t.Errorf("FromProto(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if _, err := ParseMode("wide-open"); err == nil {
		t.Error("ParseMode accepted an unknown mode")
	}
}

func TestEnvironIsAnAllowList(t *testing.T) {
	t.Parallel()
	env := Environ([]string{"PATH=/bin", "OPENAI_API_KEY=sk", "HOME=/root", "RANDOM_THING=x", "MY_TOOL=y"}, []string{"MY_TOOL"}, "TMPDIR=/t")
	for _, want := range []string{"PATH=/bin", "HOME=/root", "MY_TOOL=y", "TMPDIR=/t", "TERM=dumb"} {
		if !slices.Contains(env, want) {
			t.Errorf("missing %s in %v", want, env)
		}
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "OPENAI_API_KEY") || strings.HasPrefix(kv, "RANDOM_THING") {
			t.Errorf("%s leaked", kv)
		}
	}
	if env := Environ(nil, nil); !slices.Contains(env, "PATH="+defaultPath) {
		t.Errorf("no default PATH: %v", env)
	}
}

// TestConfinedModesFailClosed: with no working launcher, confined policies
// are refused, not run unconfined.
func TestConfinedModesFailClosed(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	s, err := New(Config{HostRoot: root, Exe: root + "/missing"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, m := range []Mode{ReadOnly, WorkspaceWrite} {
		if _, err := s.Command(Call{Policy: Policy{Mode: m}, Root: root, Dir: root, Command: "true"}); err == nil {
			t.Errorf("%s: a command was prepared without a sandbox", m)
		}
		if e := s.Enforcement(Policy{Mode: m}); e != toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_UNSPECIFIED {
			t.Errorf("%s: enforcement %v", m, e)
		}
	}
}
