package toolpipe_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/approval"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestApprovalSubjectIsTheToolsPath is an attacker's try at a path rule
// through the real built-in toolhost and approval gate: grep may search
// public/ only (grep(<ws>/public/*)=allow, grep=deny). A call that names
// public/a under "file_path", a key grep ignores, while grep searches its
// "path" (or, without one, the working directory) must be denied, and the
// secret it would find must not reach the result.
func TestApprovalSubjectIsTheToolsPath(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	for name, body := range map[string]string{"public/a.txt": "nothing here\n", "secret/key.txt": "TOKEN=hunter2\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(h.Workspace, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.Workspace, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log, err := session.NewLog(&sessionv1.SessionHeader{Id: "s", Cwd: h.Workspace}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &approval.Config{Rules: []*sessionv1.ApprovalRule{
		{Tool: "grep", Pattern: filepath.Join(h.Workspace, "public") + "/*", Action: sessionv1.RuleAction_RULE_ACTION_ALLOW},
		{Tool: "grep", Action: sessionv1.RuleAction_RULE_ACTION_DENY},
	}}
	gate := approval.NewGate(cfg, log, func(context.Context) error { return nil })
	p := toolpipe.New(toolpipe.Config{Hosts: []toolpipe.Host{{Name: "builtin", Client: h.Client}},
		Gates: func(string) toolpipe.Gate { return gate }})
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for _, tc := range []struct {
		name, args string
		allowed    bool
		refusal    string // the gate's reason
	}{
		{"a file in the allowed directory", `{"pattern":"TOKEN|nothing","path":"public/a.txt"}`, true, ""},
		{"a decoy file_path, no path (the working directory)", `{"pattern":"TOKEN","file_path":"public/a.txt"}`, false, "denied by the approval rule"},
		{"a decoy file_path beside the searched path", `{"pattern":"TOKEN","path":"secret","file_path":"public/a.txt"}`, false, "denied by the approval rule"},
		{"the path again under a key in other case", `{"pattern":"TOKEN","path":"public/a.txt","PATH":"secret"}`, false, "differs only in case"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := &toolsv1.ToolExecution{CallId: "c", Name: "grep", Arguments: tc.args,
				Context: &toolsv1.ToolContext{SessionId: "s", Cwd: h.Workspace, Turn: 1, Step: 1}}
			c := p.Begin(t.Context(), nil, ex)
			c.Dispatch(t.Context(), nil)
			r := c.Finish(t.Context())
			text := ""
			for _, b := range r.GetContent() {
				text += b.GetText().GetText()
			}
			if strings.Contains(text, "hunter2") {
				t.Fatalf("the secret reached the result: %s", text)
			}
			if tc.allowed && r.GetIsError() {
				t.Errorf("refused, want allowed: %s", text)
			}
			if !tc.allowed && (!r.GetIsError() || !strings.Contains(text, tc.refusal)) {
				t.Errorf("result %q, want a refusal with %q", text, tc.refusal)
			}
		})
	}
}
