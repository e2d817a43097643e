package search

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
	"github.com/dsh-dev/dsh/services/toolhost/internal/spill"
)

func TestGlobMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pat, path string
		want      bool
	}{
		{"*.go", "a.go", true},
		{"*.go", "x/y/a.go", true},
		{"*.go", "a.go.txt", false},
		{"**/*.go", "a.go", true},
		{"**/*.go", "x/y/a.go", true},
		{"src/**/*.ts", "src/a.ts", true},
		{"src/**/*.ts", "src/x/y/a.ts", true},
		{"src/**/*.ts", "lib/a.ts", false},
		{"src/*.ts", "src/x/a.ts", false},
		{"*.{ts,tsx}", "a.tsx", true},
		{"*.{ts,tsx}", "a.js", false},
		{"file?.txt", "file1.txt", true},
		{"[!a]*.md", "b.md", true},
		{"[!a]*.md", "a.md", false},
		{"./docs/*.md", "docs/x.md", true},
		{`\*.md`, "*.md", true},
	}
	for _, tt := range tests {
		m, err := newMatcher(tt.pat)
		if err != nil {
			t.Fatalf("%s: %v", tt.pat, err)
		}
		if got := m.match(tt.path); got != tt.want {
			t.Errorf("match(%q, %q) = %v, want %v", tt.pat, tt.path, got, tt.want)
		}
	}
	for _, bad := range []string{"[abc", "{a,b"} {
		if _, err := newMatcher(bad); err == nil {
			t.Errorf("%q compiled", bad)
		}
	}
}

func FuzzGlob(f *testing.F) {
	for _, s := range []string{"**/*.go", "{a,{b,c}}", "[!x]?", `\`, "}", "a/**"} {
		f.Add(s, "a/b/c.go")
	}
	f.Fuzz(func(t *testing.T, pat, path string) {
		if m, err := newMatcher(pat); err == nil {
			m.match(path)
		}
	})
}

type env struct {
	t    *testing.T
	root string
	host *toolsdk.Host
}

func newEnv(t *testing.T) *env {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	sp, err := spill.New(filepath.Join(t.TempDir(), "spill"))
	if err != nil {
		t.Fatal(err)
	}
	conf := &fstools.Confiner{Root: root, ReadOnly: []string{sp.Root()}}
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, New(conf, sp).Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, root: root, host: h}
}

func (e *env) file(rel, content string, age time.Duration) {
	p := filepath.Join(e.root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	mt := time.Now().Add(-age)
	os.Chtimes(p, mt, mt)
}

func (e *env) run(tool string, args any) *toolsv1.ToolExecutionResult {
	b, _ := json.Marshal(args)
	return e.host.Run(e.t.Context(), &toolsv1.ToolExecution{CallId: "c", Name: tool, Arguments: string(b),
		Context: &toolsv1.ToolContext{SessionId: "s", Cwd: e.root}}, nil)
}

func TestGlobAndGrep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.file("old.go", "package old\nfunc Hello() {}\n", 3*time.Hour)
	e.file("pkg/new.go", "package pkg\r\n// hello world\r\nfunc Hello() {}\r\n", time.Hour)
	e.file(".hidden/h.go", "func Hello() {}\n", 2*time.Hour)
	e.file(".git/objects/x.go", "func Hello() {}\n", 0)
	e.file("bin.go", "func Hello() {}\x00\n", 0)
	e.file("notes.md", "Hello there\n", 4*time.Hour)
	r := e.root
	tests := []struct {
		name, tool string
		args       any
		want       string
	}{
		{"glob newest first, hidden included, vcs skipped", "glob", GlobArgs{Pattern: "**/*.go"},
			r + "/bin.go\n" + r + "/pkg/new.go\n" + r + "/.hidden/h.go\n" + r + "/old.go"},
		{"glob in a subdir", "glob", GlobArgs{Pattern: "*.go", Path: "pkg"}, r + "/pkg/new.go"},
		{"glob none", "glob", GlobArgs{Pattern: "*.rs"}, "No files found"},
		{"grep grouped, binary skipped", "grep", GrepArgs{Pattern: "func Hel+o", Include: "*.go"},
			"Found 3 matches\n" + r + "/pkg/new.go:\n  Line 3: func Hello() {}\n\n" + r + "/.hidden/h.go:\n  Line 1: func Hello() {}\n\n" + r + "/old.go:\n  Line 2: func Hello() {}"},
		{"grep case-insensitive flag", "grep", GrepArgs{Pattern: "(?i)^hello"}, "Found 1 matches\n" + r + "/notes.md:\n  Line 1: Hello there"},
		{"grep single file", "grep", GrepArgs{Pattern: "world", Path: "pkg/new.go"}, "Found 1 matches\n" + r + "/pkg/new.go:\n  Line 2: // hello world"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := e.run(tt.tool, tt.args)
			if diff := cmp.Diff(tt.want, toolsdk.ResultText(res.GetContent())); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	for _, bad := range []any{GrepArgs{Pattern: "("}, GlobArgs{Pattern: "{a"}} {
		tool := "grep"
		if _, ok := bad.(GlobArgs); ok {
			tool = "glob"
		}
		if res := e.run(tool, bad); res.GetError().GetCode() != "INVALID_ARGS" {
			t.Errorf("%v: %v", bad, res)
		}
	}
	if res := e.run("glob", GlobArgs{Pattern: "*", Path: "/etc"}); res.GetError().GetCode() != "FS_PERMISSION_DENIED" {
		t.Errorf("glob outside the workspace: %v", res)
	}
}

func TestCapsSpillTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 300 {
		e.file(filepath.Join("d", fmt.Sprintf("f%03d.txt", i)), "match\n", time.Duration(i)*time.Second)
	}
	res := e.run("glob", GlobArgs{Pattern: "*.txt"})
	txt := toolsdk.ResultText(res.GetContent())
	if n := strings.Count(txt, ".txt\n"); n != GlobInline || !strings.Contains(txt, "showing the first 100 of 300 files. Full list: ") {
		t.Fatalf("glob cap: %d lines\n%s", n, txt[len(txt)-200:])
	}
	full := spilled(t, txt, "Full list: ")
	if strings.Count(full, "\n") != 300 {
		t.Errorf("spilled glob list has %d lines", strings.Count(full, "\n"))
	}
	// The spill file is readable back through the confiner's read-only roots.
	res = e.run("grep", GrepArgs{Pattern: "match"})
	txt = toolsdk.ResultText(res.GetContent())
	if !strings.Contains(txt, "showing the first 250 of 300 matches") {
		t.Fatalf("grep cap:\n%s", txt[len(txt)-200:])
	}
	if full := spilled(t, txt, "Full results: "); strings.Count(full, "Line 1: match") != 300 {
		t.Errorf("spilled grep results incomplete")
	}
	if v := res.GetView().GetGeneric().GetTitle(); v != "300 matches in 300 files" {
		t.Errorf("view title %q", v)
	}
}

func spilled(t *testing.T, txt, marker string) string {
	t.Helper()
	i := strings.Index(txt, marker)
	if i < 0 {
		t.Fatalf("no %q in result", marker)
	}
	p := strings.TrimSuffix(txt[i+len(marker):], ")")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
