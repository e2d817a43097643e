package toolhost_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestGetWorkspaceContext goes over gRPC: the context of a directory in the
// workspace, and INVALID_ARGUMENT for one outside it (an attacker's probe for
// another tree's AGENTS.md must fail).
func TestGetWorkspaceContext(t *testing.T) {
	t.Parallel()
	outer := t.TempDir()
	ws := filepath.Join(outer, "ws")
	writeTree(t, outer, map[string]string{
		"ws/.git/HEAD": "x", "ws/AGENTS.md": "be brief", "ws/.agents/skills/review.md": "---\ndescription: Review code.\n---\nsteps",
		"secret/AGENTS.md": "secret",
	})
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

// writeTree writes files under dir: path -> content, or "->target" for a
// symbolic link to target.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(c, "->"); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(c), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestGetWorkspaceContextSessionRoot attacks GetWorkspaceContext over gRPC
// as a session whose workspace root is ws/a on a host whose root is ws
// (which holds a .git, an AGENTS.md and a skill), beside a session of ws/b:
// ws/a/AGENTS.md is a link to ws/b's, ws/a/.dsh/skills a link to ws/b's
// skills. With workspace_root ws/a none of ws/b's or ws's instructions or
// skills may reach the answer (a host ignoring the field gives them all);
// without it the context is the host-bounded one, as before. A session
// root outside the host's, or a cwd outside the session root, is refused.
func TestGetWorkspaceContextSessionRoot(t *testing.T) {
	t.Parallel()
	const hostCanary, sibCanary = "HOST-ROOT-AGENTS-CANARY-51d2", "SIBLING-AGENTS-CANARY-9e07"
	outer, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(outer, "ws")
	a, b := filepath.Join(ws, "a"), filepath.Join(ws, "b")
	writeTree(t, outer, map[string]string{
		"ws/.git/HEAD":                    "ref: refs/heads/main\n",
		"ws/AGENTS.md":                    hostCanary,
		"ws/.agents/skills/hostskill.md":  "---\ndescription: Host.\n---\n" + hostCanary,
		"ws/b/AGENTS.md":                  sibCanary,
		"ws/b/.agents/skills/sibskill.md": "---\ndescription: Sibling.\n---\n" + sibCanary,
		"ws/a/AGENTS.md":                  "->" + filepath.Join(b, "AGENTS.md"),
		"ws/a/.dsh/skills":                "->../../b/.agents/skills",
		"ws/a/.agents/skills/own.md":      "---\ndescription: Own.\n---\nown",
		"ws/a/sub/AGENTS.md":              "session a's own instructions",
		"ws/a/to-b":                       "->../b",
		"ws/out":                          "->../elsewhere",
		"elsewhere/AGENTS.md":             "elsewhere",
	})
	h := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws))
	ask := func(cwd, root string) (*toolsv1.GetWorkspaceContextResponse, error) {
		return h.Client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: cwd, WorkspaceRoot: root})
	}
	skills := func(resp *toolsv1.GetWorkspaceContextResponse) []string {
		var names []string
		for _, s := range resp.GetSkills() {
			names = append(names, s.GetName())
		}
		return names
	}
	// ws/a has no .git: the project root is the cwd (the search stops at
	// ws/a), so ws/a/sub lists no skills.
	for cwd, want := range map[string][]string{a: {"own"}, filepath.Join(a, "sub"): nil} {
		resp, err := ask(cwd, a)
		if err != nil {
			t.Fatalf("cwd %s, workspace_root %s: %v", cwd, a, err)
		}
		text := resp.String()
		for _, leak := range []string{hostCanary, sibCanary, "hostskill", "sibskill"} {
			if strings.Contains(text, leak) {
				t.Errorf("cwd %s, workspace_root %s: the context holds %s, from outside the session root: %v", cwd, a, leak, text)
			}
		}
		if resp.GetProjectRoot() != cwd || !slices.Equal(skills(resp), want) {
			t.Errorf("cwd %s, workspace_root %s: project root %s, skills %v; want %s, %v", cwd, a, resp.GetProjectRoot(), skills(resp), cwd, want)
		}
	}
	if resp, err := ask(filepath.Join(a, "sub"), a+"/"); err != nil || len(resp.GetInstructions()) != 1 ||
		resp.GetInstructions()[0].GetContent() != "session a's own instructions" {
		t.Errorf("the session's own instructions: %v %v", resp, err)
	}
	// Without a session root the context is the host's, as before: ws's
	// project, and ws/b's file through the link (ws/b is inside ws).
	resp, err := ask(a, "")
	if err != nil {
		t.Fatal(err)
	}
	if text := resp.String(); resp.GetProjectRoot() != ws || !strings.Contains(text, hostCanary) || !strings.Contains(text, sibCanary) ||
		!slices.Contains(skills(resp), "hostskill") {
		t.Errorf("host-bounded context of %s: %v", a, text)
	}
	for _, tc := range []struct{ name, cwd, root, want string }{
		{"root outside the host's", filepath.Join(outer, "elsewhere"), filepath.Join(outer, "elsewhere"), "outside this host's workspace"},
		{"root resolving outside the host's", filepath.Join(ws, "out"), filepath.Join(ws, "out"), "outside this host's workspace"},
		{"root above the host's", ws, outer, "outside this host's workspace"},
		{"cwd in a sibling", b, a, "is outside workspace_root"},
		{"cwd a link to a sibling", filepath.Join(a, "to-b"), a, "outside workspace_root"},
		{"relative root", a, "ws/a", "must be an absolute path"},
	} {
		_, err := ask(tc.cwd, tc.root)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s (cwd %s, workspace_root %s): %v, want INVALID_ARGUMENT saying %q", tc.name, tc.cwd, tc.root, err, tc.want)
		}
	}
}

// TestGetWorkspaceContextSessionRootUnconfined: an --unconfined host still
// bounds a session's context by its workspace_root (the .git search stops
// there, so the host project's AGENTS.md stays out), and refuses a root
// that does not resolve.
func TestGetWorkspaceContextSessionRootUnconfined(t *testing.T) {
	t.Parallel()
	const hostCanary = "HOST-ROOT-AGENTS-CANARY-unconfined"
	outer, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(outer, "ws")
	a := filepath.Join(ws, "a")
	writeTree(t, outer, map[string]string{
		"ws/.git/HEAD":  "ref: refs/heads/main\n",
		"ws/AGENTS.md":  hostCanary,
		"ws/a/notes.md": "a file",
	})
	h := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws), toolhosttest.WithConfig(func(c *toolhost.Config) { c.Unconfined = true }))
	resp, err := h.Client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: a, WorkspaceRoot: a})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetProjectRoot() != a || strings.Contains(resp.String(), hostCanary) {
		t.Errorf("unconfined, workspace_root %s: project root %s, context %v; want %s and no host AGENTS.md", a, resp.GetProjectRoot(), resp, a)
	}
	missing := filepath.Join(ws, "missing")
	if _, err := h.Client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: missing, WorkspaceRoot: missing}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unconfined, a workspace_root that does not resolve: %v, want INVALID_ARGUMENT", err)
	}
}
