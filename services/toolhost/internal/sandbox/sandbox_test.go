package sandbox

import (
	"errors"
	"os"
	"path/filepath"
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

// TestCommandWaitsForTheProbe: the probe runs in the background, and a
// confined call asked for while it is still running (here a launcher that
// takes 300 ms to fail) waits for its verdict and is refused, never prepared
// on a guess.
func TestCommandWaitsForTheProbe(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	slow := filepath.Join(root, "slow-launcher")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nsleep 0.3\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{HostRoot: root, Exe: slow})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Command(Call{Policy: Policy{Mode: WorkspaceWrite}, Root: root, Dir: root, Command: "true"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a confined call during the probe: err %v, want ErrUnavailable", err)
	}
	if s.Support().Unavailable == nil {
		t.Error("Support says the sandbox works with a failing launcher")
	}
}
