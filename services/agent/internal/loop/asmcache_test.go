package loop

import (
	"reflect"
	"slices"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

// TestSameAssemblyInput: the assembly cache hits only for the same input;
// a change of any field misses. A field added to prompt.Input must be
// taught to sameInput (the field count below fails first).
func TestSameAssemblyInput(t *testing.T) {
	t.Parallel()
	if n := reflect.TypeOf(prompt.Input{}).NumField(); n != 9 {
		t.Fatalf("prompt.Input has %d fields: teach sameInput the new ones, then update this count", n)
	}
	tools := []*llmv1.ToolSchema{{Name: "a"}, {Name: "b"}}
	ws := &toolsv1.GetWorkspaceContextResponse{Version: "1"}
	base := func() prompt.Input {
		return prompt.Input{Provider: "p", Model: "m", Cwd: "/w", Persona: "x", SystemPrompt: "s", Tools: slices.Clone(tools),
			Workspace: ws, ApprovalNever: false, Sections: []prompt.Section{{Name: "n", Order: 1, Text: "t"}}}
	}
	if !sameInput(base(), base()) {
		t.Fatal("the same input misses")
	}
	for name, mutate := range map[string]func(*prompt.Input){
		"provider":       func(in *prompt.Input) { in.Provider = "q" },
		"model":          func(in *prompt.Input) { in.Model = "n" },
		"cwd":            func(in *prompt.Input) { in.Cwd = "/v" },
		"persona":        func(in *prompt.Input) { in.Persona = "" },
		"system prompt":  func(in *prompt.Input) { in.SystemPrompt = "t" },
		"a tool":         func(in *prompt.Input) { in.Tools[1] = &llmv1.ToolSchema{Name: "b"} },
		"fewer tools":    func(in *prompt.Input) { in.Tools = in.Tools[:1] },
		"workspace":      func(in *prompt.Input) { in.Workspace = &toolsv1.GetWorkspaceContextResponse{Version: "1"} },
		"approval never": func(in *prompt.Input) { in.ApprovalNever = true },
		"section text":   func(in *prompt.Input) { in.Sections[0].Text = "u" },
		"section order":  func(in *prompt.Input) { in.Sections[0].Order = 2 },
		"section added":  func(in *prompt.Input) { in.Sections = append(in.Sections, prompt.Section{Name: "o"}) },
	} {
		in := base()
		mutate(&in)
		if sameInput(base(), in) {
			t.Errorf("a changed %s hits the cache", name)
		}
	}
}
