package prompt_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"provider": "deepseek", "model": "v4", "cwd": "/w", "empty": "", "loop": "{{model}}", "team.name": "core"}
	tests := []struct {
		in, want string
		err      string
	}{
		{"plain", "plain", ""},
		{"{{provider}}/{{ model }}", "deepseek/v4", ""},
		{"in {{cwd}} for {{team.name}}", "in /w for core", ""},
		{"lone {{ brace", "lone {{ brace", ""},
		{"{{provider}} {{", "deepseek {{", ""},
		{"}} before {{cwd}}", "}} before /w", ""},
		{"{{loop}}", "{{model}}", ""}, // substituted values are not re-scanned
		{"{{unknown}}", "", `unknown template variable "unknown"`},
		{"{{empty}}", "", `template variable "empty" has no value`},
		{"{{not a name}}", "", "malformed template group"},
		{"{{}}", "", "malformed template group"},
		{"{{ {{model}}", "", "malformed template group"}, // a {{ that opens no group while }} follows
		{"{{model}} then {{x y}}", "", "malformed template group"},
	}
	for _, tc := range tests {
		got, err := prompt.Render(tc.in, vars)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Render(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Render(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func FuzzRender(f *testing.F) {
	for _, s := range []string{"", "{{provider}}", "{{", "}}{{x}}", "a {{ model }} b {{cwd}}", "{{{{}}}}"} {
		f.Add(s)
	}
	vars := map[string]string{"provider": "p", "model": "m", "cwd": "/c"}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := prompt.Render(s, vars)
		if err == nil && !strings.Contains(s, "{{") && out != s {
			t.Fatalf("a template without groups changed: %q -> %q", s, out)
		}
	})
}

func tools(names ...string) []*llmv1.ToolSchema {
	out := make([]*llmv1.ToolSchema, len(names))
	for i, n := range names {
		out[i] = &llmv1.ToolSchema{Name: n}
	}
	return out
}

func names(ts []*llmv1.ToolSchema) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.GetName())
	}
	return out
}

var ws = &toolsv1.GetWorkspaceContextResponse{
	OwnsWorkspace: true, ProjectRoot: "/repo", Version: "v1",
	Instructions: []*toolsv1.InstructionFile{
		{Path: "/repo/AGENTS.md", Content: "Run make test. Templates like {{model}} are text here.\n", SizeBytes: 55},
		{Path: "/repo/pkg/CLAUDE.md", Content: "Keep pkg small", SizeBytes: 400, Truncated: true},
	},
	Skills: []*toolsv1.SkillSummary{
		{Name: "alpha", Description: "Does <alpha> & more.", WhenToUse: "When\n  alpha."},
		{Name: "hidden", Description: "Humans only.", DisableModelInvocation: true},
		{Name: "long", Description: strings.Repeat("x", 600)},
	},
}

func TestAssembleGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  prompt.Config
		in   prompt.Input
	}{
		{"defaults", prompt.Config{}, prompt.Input{Provider: "p", Model: "m", Cwd: "/repo"}},
		{"full", prompt.Config{
			Persona: "You work for {{team}} on {{model}}.", ToolGuidance: "Prefer read before edit.",
			Variables: map[string]string{"team": "Platform"},
			Sections: []prompt.Section{
				{Name: "late", Order: 500, Text: "Late section in {{cwd}}."},
				{Name: "early", Order: -200, Text: "Before the identity."},
				{Name: "tie-a", Order: 150, Text: "Tie A."},
				{Name: "tie-b", Order: 150, Text: "Tie B (registration order)."},
				{Name: "empty", Order: 300, Text: "   "},
			},
		}, prompt.Input{Provider: "p", Model: "m", Cwd: "/repo", SystemPrompt: "Session text.", Tools: tools("read"), Workspace: ws}},
		{"approval never", prompt.Config{}, prompt.Input{Provider: "p", Model: "m", Cwd: "/w", ApprovalNever: true, SystemPrompt: "Last."}},
		{"session persona without tools", prompt.Config{Identity: "-", ToolGuidance: "unused without tools"},
			prompt.Input{Provider: "p", Model: "m", Cwd: "/w", Persona: "You are Ada on {{model}}."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := prompt.New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			asm, err := a.Assemble(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			var prefix []string
			for _, m := range asm.Prefix {
				prefix = append(prefix, m.GetRole().String()+": "+m.GetContent()[0].GetText().GetText())
			}
			golden(t, "assemble-"+strings.ReplaceAll(tt.name, " ", "-"),
				"== system\n"+asm.System+"\n== tools\n"+strings.Join(names(asm.Tools), ",")+"\n== prefix\n"+strings.Join(prefix, "\n")+"\n")
		})
	}
}

func TestAssembleErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  prompt.Config
		in   prompt.Input
		err  string
	}{
		{"unknown variable in a deployment section", prompt.Config{Sections: []prompt.Section{{Name: "s", Text: "Hi {{tenant}}"}}},
			prompt.Input{Provider: "p", Model: "m", Cwd: "/w"}, `system prompt section "s": unknown template variable "tenant"`},
		{"valueless cwd in the identity", prompt.Config{}, prompt.Input{Provider: "p", Model: "m"},
			`system prompt section "harness:identity": template variable "cwd" has no value`},
		{"session persona with a bad group", prompt.Config{}, prompt.Input{Provider: "p", Model: "m", Cwd: "/w", Persona: "{{a b}}"},
			"malformed template group"},
		{"tool order names an unknown tool", prompt.Config{ToolOrder: []string{"bash", prompt.UnlistedTools}},
			prompt.Input{Provider: "p", Model: "m", Cwd: "/w", Tools: tools("read")}, `tool order names "bash", which no visible toolhost serves`},
	}
	for _, tt := range tests {
		a, err := prompt.New(tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Assemble(tt.in); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.err)
		}
	}
}

func TestToolOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		order []string
		want  string
	}{
		{nil, "a,b,bash,read,z"},
		{[]string{"read", "bash", prompt.UnlistedTools}, "read,bash,a,b,z"},
		{[]string{prompt.UnlistedTools, "a"}, "b,bash,read,z,a"},
		{[]string{"z", prompt.UnlistedTools, "a"}, "z,b,bash,read,a"},
	}
	for _, tt := range tests {
		a, err := prompt.New(prompt.Config{ToolOrder: tt.order})
		if err != nil {
			t.Fatal(err)
		}
		asm, err := a.Assemble(prompt.Input{Provider: "p", Model: "m", Cwd: "/w", Tools: tools("read", "z", "bash", "b", "a")})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(names(asm.Tools), ","); got != tt.want {
			t.Errorf("order %v: %s, want %s", tt.order, got, tt.want)
		}
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  prompt.Config
		err  string
	}{
		{"no rest entry", prompt.Config{ToolOrder: []string{"a"}}, "exactly one <unlisted-tools>"},
		{"two rest entries", prompt.Config{ToolOrder: []string{prompt.UnlistedTools, prompt.UnlistedTools}}, "has 2"},
		{"repeated tool", prompt.Config{ToolOrder: []string{"a", "a", prompt.UnlistedTools}}, `names "a" twice`},
		{"duplicate section", prompt.Config{Sections: []prompt.Section{{Name: "x"}, {Name: "x"}}}, `"x" is used twice`},
		{"built-in section name", prompt.Config{Sections: []prompt.Section{{Name: prompt.SectionSession}}}, "built-in"},
		{"unnamed section", prompt.Config{Sections: []prompt.Section{{Text: "x"}}}, "has no name"},
		{"redefined variable", prompt.Config{Variables: map[string]string{"model": "x"}}, `"model" is set by the agent`},
		{"bad variable name", prompt.Config{Variables: map[string]string{"a b": "x"}}, "is not a name"},
	}
	for _, tt := range tests {
		if _, err := prompt.New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.err)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := prompt.LoadConfig(write("ok.yaml", "persona: Be kind.\nvariables: {team: core}\ntool_order: [read, <unlisted-tools>]\nsections:\n  - name: rules\n    order: 150\n    text: Team {{team}}.\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := prompt.Config{Persona: "Be kind.", Variables: map[string]string{"team": "core"}, ToolOrder: []string{"read", prompt.UnlistedTools},
		Sections: []prompt.Section{{Name: "rules", Order: 150, Text: "Team {{team}}."}}}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	for name, body := range map[string]string{
		"typo.yaml":  "sectons: []\n",
		"bad.yaml":   "sections: [\n",
		"order.json": `{"tool_order": ["a"]}`,
	} {
		if _, err := prompt.LoadConfig(write(name, body)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want one naming the file", name, err)
		}
	}
	if _, err := prompt.LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
}

// fakeHost is a toolhost's workspace answer (a fake of the upstream).
type fakeHost struct {
	resp *toolsv1.GetWorkspaceContextResponse
	err  error
	cwd  string
}

func (f *fakeHost) GetWorkspaceContext(_ context.Context, in *toolsv1.GetWorkspaceContextRequest, _ ...grpc.CallOption) (*toolsv1.GetWorkspaceContextResponse, error) {
	f.cwd = in.GetCwd()
	return f.resp, f.err
}

func TestWorkspacesMerge(t *testing.T) {
	t.Parallel()
	a := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, ProjectRoot: "/r", Version: "va",
		Instructions: []*toolsv1.InstructionFile{{Path: "/r/AGENTS.md", Content: "a"}},
		Skills:       []*toolsv1.SkillSummary{{Name: "s2"}, {Name: "s1"}},
		Notices:      []*toolsv1.WorkspaceNotice{{Path: "/r/x", Message: "skipped"}}}}
	b := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, ProjectRoot: "/other", Version: "vb",
		Skills: []*toolsv1.SkillSummary{{Name: "s1", Path: "/b/s1.md"}, {Name: "s0"}}}}
	none := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{}}
	mcp := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{Version: "vm", ProjectRoot: "/ignored",
		Instructions: []*toolsv1.InstructionFile{{Path: "mcp://fs", Content: "use fs tools"}},
		Skills:       []*toolsv1.SkillSummary{{Name: "ignored"}}}}
	old := &fakeHost{err: status.Error(codes.Unimplemented, "unknown method")}
	broken := &fakeHost{err: status.Error(codes.Unavailable, "connection refused")}
	hidden := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, Instructions: []*toolsv1.InstructionFile{{Content: "never"}}}}
	w := &prompt.Workspaces{Hosts: []prompt.Host{{"a", a}, {"none", none}, {"mcp", mcp}, {"old", old}, {"broken", broken}, {"b", b}, {"hidden", hidden}}}
	got, err := w.Context(t.Context(), "/r", "", []string{"a", "none", "mcp", "old", "broken", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if a.cwd != "/r" || hidden.cwd != "" {
		t.Errorf("asked a with %q, hidden with %q", a.cwd, hidden.cwd)
	}
	var skills []string
	for _, s := range got.GetSkills() {
		skills = append(skills, s.GetName())
	}
	var files []string
	for _, f := range got.GetInstructions() {
		files = append(files, f.GetPath())
	}
	if !got.GetOwnsWorkspace() || got.GetProjectRoot() != "/r" || strings.Join(files, ",") != "/r/AGENTS.md,mcp://fs" ||
		strings.Join(skills, ",") != "s0,s1,s2" || got.GetVersion() != "a:va,mcp:vm,broken:error,b:vb" {
		t.Errorf("merged %v", got)
	}
	var msgs []string
	for _, n := range append(got.GetNotices(), got.GetSkillErrors()...) {
		msgs = append(msgs, n.GetMessage())
	}
	want := []string{"toolhost a: skipped", "toolhost broken: workspace context unavailable: connection refused",
		`toolhost b: skill "s1" not offered: another toolhost lists it first`}
	if diff := cmp.Diff(want, msgs); diff != "" {
		t.Errorf("notices (-want +got):\n%s", diff)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := w.Context(ctx, "/r", "", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled read: %v", err)
	}
}

// TestHookSections: sections from agent/prompt-sections replace built-in
// ones by name, are added otherwise, and an empty text drops a section.
func TestHookSections(t *testing.T) {
	t.Parallel()
	a, err := prompt.New(prompt.Config{Persona: "Deployment persona."})
	if err != nil {
		t.Fatal(err)
	}
	asm, err := a.Assemble(prompt.Input{Provider: "p", Model: "m", Cwd: "/w", Sections: []prompt.Section{
		{Name: prompt.SectionIdentity, Order: prompt.OrderIdentity, Text: "Hook identity on {{model}}."},
		{Name: prompt.SectionPersona, Text: ""},
		{Name: "hook:extra", Order: 120, Text: "{{literal}} stays", Literal: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "Hook identity on m.\n\n{{literal}} stays"; asm.System != want {
		t.Errorf("system %q, want %q", asm.System, want)
	}
}

// BenchmarkAssemble is the per-step cost of assembly with a workspace
// context and 20 tools.
func BenchmarkAssemble(b *testing.B) {
	a, err := prompt.New(prompt.Config{Persona: "You work for {{team}}.", Variables: map[string]string{"team": "core"},
		ToolOrder: []string{"t05", prompt.UnlistedTools}, ToolGuidance: "Use tools."})
	if err != nil {
		b.Fatal(err)
	}
	var ts []string
	for i := range 20 {
		ts = append(ts, fmt.Sprintf("t%02d", 19-i))
	}
	in := prompt.Input{Provider: "p", Model: "m", Cwd: "/repo", Tools: tools(ts...), Workspace: ws, SystemPrompt: "Session text."}
	for b.Loop() {
		if _, err := a.Assemble(in); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCheckCwd: a visible host that refuses the cwd (INVALID_ARGUMENT) makes
// it an error naming the host; hosts that accept it, own no workspace,
// predate the RPC, are down or are not visible do not.
func TestCheckCwd(t *testing.T) {
	t.Parallel()
	ok := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true}}
	none := &fakeHost{resp: &toolsv1.GetWorkspaceContextResponse{}}
	old := &fakeHost{err: status.Error(codes.Unimplemented, "unknown method")}
	down := &fakeHost{err: status.Error(codes.Unavailable, "connection refused")}
	refuses := &fakeHost{err: status.Error(codes.InvalidArgument, "cwd is outside the workspace: /home/me is not inside /workspace")}
	all := []prompt.Host{{"ok", ok}, {"none", none}, {"old", old}, {"down", down}, {"ws", refuses}}
	for _, tc := range []struct {
		name    string
		hosts   []prompt.Host
		visible []string
		wantErr string
	}{
		{"accepted or unknowable", all[:4], nil, ""},
		{"a visible host refuses", all, nil, "toolhost ws refuses cwd /home/me: cwd is outside the workspace"},
		{"the refusing host is not visible", all, []string{"ok", "down"}, ""},
		{"only the refusing host is visible", all, []string{"ws"}, "toolhost ws refuses"},
	} {
		w := &prompt.Workspaces{Hosts: tc.hosts}
		err := w.CheckCwd(t.Context(), "/home/me", "", tc.visible)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
	}
	if ok.cwd != "/home/me" {
		t.Errorf("the host was asked about %q", ok.cwd)
	}
}
