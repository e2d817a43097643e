package workspace_test

import (
	"path/filepath"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/workspace"
)

func TestSkillTool(t *testing.T) {
	t.Parallel()
	root := tree(t, map[string]string{
		"ws/.git/HEAD":                     "x",
		"ws/sub/placeholder":               "",
		"ws/.agents/skills/alpha/SKILL.md": skillA,
		"ws/.agents/skills/human.md":       "---\ndescription: For people.\ndisable-model-invocation: true\n---\nsecret",
		"outside/.agents/skills/x.md":      "---\ndescription: never\n---\n",
	})
	ws := filepath.Join(root, "ws")
	r, err := workspace.New(workspace.Config{Root: ws})
	if err != nil {
		t.Fatal(err)
	}
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, r.Tool(nil))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, cwd, args, golden, text, code string
	}{
		{name: "load from a subdirectory", cwd: "ws/sub", args: `{"name":"alpha"}`, golden: "skill-alpha"},
		{name: "unknown", cwd: "ws", args: `{"name":"nope"}`, code: workspace.CodeUnknownSkill,
			text: `Error: unknown skill "nope"; available skills: alpha`},
		{name: "human only", cwd: "ws", args: `{"name":"human"}`, code: workspace.CodeSkillRefused,
			text: `Error: skill "human" is only for humans to invoke (disable-model-invocation)`},
		{name: "cwd outside", cwd: "outside", args: `{"name":"x"}`, code: workspace.CodeBadCwd},
		{name: "missing name", cwd: "ws", args: `{}`, code: "INVALID_ARGS"},
		{name: "path as a name", cwd: "ws", args: `{"name":"../../outside/.agents/skills/x"}`, code: workspace.CodeUnknownSkill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := h.Run(t.Context(), &toolsv1.ToolExecution{Name: workspace.SkillToolName, Arguments: tt.args,
				Context: &toolsv1.ToolContext{Cwd: filepath.Join(root, tt.cwd)}}, nil)
			text := toolsdk.ResultText(res.GetContent())
			if tt.code != "" {
				if !res.GetIsError() || res.GetError().GetCode() != tt.code {
					t.Fatalf("result %v, want error %s", res, tt.code)
				}
				if tt.text != "" && text != tt.text {
					t.Errorf("text %q, want %q", text, tt.text)
				}
				if strings.Contains(text, "secret") {
					t.Error("a refused skill's body leaked")
				}
				return
			}
			if res.GetIsError() {
				t.Fatalf("error: %s", text)
			}
			golden(t, tt.golden, strings.ReplaceAll(text, root, "$ROOT")+"\n")
		})
	}
}
