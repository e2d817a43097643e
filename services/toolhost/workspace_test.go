package toolhost_test

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestGetWorkspaceContext goes over gRPC: the context of a directory in the
// workspace, and INVALID_ARGUMENT for one outside it (an attacker's probe for
// another tree's AGENTS.md must fail).
func TestGetWorkspaceContext(t *testing.T) {
	t.Parallel()
	outer := t.TempDir()
	ws := filepath.Join(outer, "ws")
	for p, c := range map[string]string{
		"ws/.git/HEAD": "x", "ws/AGENTS.md": "be brief", "ws/.agents/skills/review.md": "---\ndescription: Review code.\n---\nsteps",
		"secret/AGENTS.md": "secret",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(outer, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outer, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws))
	resp, err := h.Client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: ws})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetOwnsWorkspace() || len(resp.GetInstructions()) != 1 || resp.GetInstructions()[0].GetContent() != "be brief" ||
		len(resp.GetSkills()) != 1 || resp.GetSkills()[0].GetName() != "review" || resp.GetVersion() == "" {
		t.Fatalf("context %v", resp)
	}
	for _, cwd := range []string{filepath.Join(outer, "secret"), "", "rel", filepath.Join(ws, "..", "secret")} {
		_, err := h.Client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: cwd})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("cwd %q: %v, want INVALID_ARGUMENT", cwd, err)
		}
	}
}
