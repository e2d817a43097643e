package fstools_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
)

type env struct {
	t    *testing.T
	root string
	host *toolsdk.Host
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fs := fstools.New(&fstools.Confiner{Root: root})
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, fs.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, root: root, host: h}
}

func (e *env) call(session, tool string, args any) *toolsv1.ToolExecutionResult {
	e.t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.host.Run(e.t.Context(), &toolsv1.ToolExecution{
		CallId: "c", Name: tool, Arguments: string(b),
		Context: &toolsv1.ToolContext{SessionId: session, Cwd: e.root},
	}, nil)
}

func (e *env) file(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.root, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) content(name string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.root, name))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func text(r *toolsv1.ToolExecutionResult) string { return toolsdk.ResultText(r.GetContent()) }

func code(r *toolsv1.ToolExecutionResult) string { return r.GetError().GetCode() }

func wantOK(t *testing.T, r *toolsv1.ToolExecutionResult) {
	t.Helper()
	if r.GetIsError() {
		t.Fatalf("unexpected error result: %s", text(r))
	}
}

func TestReadFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.file("a.txt", "one\ntwo\r\nthree\n")
	lines := make([]string, 30)
	for i := range lines {
		lines[i] = "l" + string(rune('a'+i%26))
	}
	long := e.file("long.txt", strings.Join(lines, "\n"))
	huge := e.file("huge.txt", "short\n"+strings.Repeat("x", 3<<20)+"\nend\n")
	latin := e.file("latin1.txt", "caf\xe9\nok\n")
	tests := []struct {
		name string
		args fstools.ReadArgs
		want string
	}{
		{"whole file, CRLF line shown without CR", fstools.ReadArgs{FilePath: "a.txt"},
			"<path>" + p + "</path>\n<type>file</type>\n<content>\n1: one\n2: two\n3: three\n\n(End of file - total 3 lines)\n</content>"},
		{"window", fstools.ReadArgs{FilePath: long, Offset: 3, Limit: 2},
			"<path>" + long + "</path>\n<type>file</type>\n<content>\n3: lc\n4: ld\n\n(Showing lines 3-4 of 30. Use offset=5 to continue.)\n</content>"},
		{"huge line truncated", fstools.ReadArgs{FilePath: "huge.txt"},
			"<path>" + huge + "</path>\n<type>file</type>\n<content>\n1: short\n2: " + strings.Repeat("x", 2000) + "... (line truncated to 2000 chars)\n3: end\n\n(End of file - total 3 lines)\n</content>"},
		{"non-UTF-8 repaired for display", fstools.ReadArgs{FilePath: "latin1.txt"},
			"<path>" + latin + "</path>\n<type>file</type>\n<content>\n1: caf\uFFFD\n2: ok\n\n(End of file - total 2 lines)\n</content>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.call("s", "read", tt.args)
			wantOK(t, r)
			if diff := cmp.Diff(tt.want, text(r)); diff != "" {
				t.Errorf("read (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadByteCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.file("big.txt", strings.Repeat(strings.Repeat("y", 999)+"\n", 100))
	r := e.call("s", "read", fstools.ReadArgs{FilePath: "big.txt"})
	wantOK(t, r)
	if !strings.Contains(text(r), "(Output capped at 50 KB. Showing lines 1-51. Use offset=52 to continue.)") {
		t.Errorf("no byte-cap footer:\n%s", text(r)[len(text(r))-200:])
	}
}

func TestReadErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.file("bin", "a\x00b")
	e.file("three", "1\n2\n3\n")
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	if err := os.Symlink(outside, filepath.Join(e.root, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args fstools.ReadArgs
		code string
	}{
		{"missing", fstools.ReadArgs{FilePath: "nope"}, "FS_NOT_FOUND"},
		{"binary", fstools.ReadArgs{FilePath: "bin"}, "FS_NOT_TEXT"},
		{"directory", fstools.ReadArgs{FilePath: "."}, "FS_NOT_REGULAR_FILE"},
		{"dotdot escape", fstools.ReadArgs{FilePath: "../../etc/passwd"}, "FS_PERMISSION_DENIED"},
		{"absolute escape", fstools.ReadArgs{FilePath: "/etc/passwd"}, "FS_PERMISSION_DENIED"},
		{"symlink escape", fstools.ReadArgs{FilePath: "link/secret"}, "FS_PERMISSION_DENIED"},
		{"offset past end", fstools.ReadArgs{FilePath: "three", Offset: 9}, "INVALID_ARGS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.call("s", "read", tt.args)
			if !r.GetIsError() || code(r) != tt.code || !strings.HasPrefix(text(r), "Error: ") {
				t.Errorf("got %v %q, want error %s", code(r), text(r), tt.code)
			}
		})
	}
}

func TestWriteSymlinkEscapeCreatesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	outside := t.TempDir()
	os.Symlink(filepath.Join(outside, "target"), filepath.Join(e.root, "dangling"))
	os.Symlink(outside, filepath.Join(e.root, "dir"))
	for _, p := range []string{"dangling", "dir/new.txt", "../x.txt"} {
		r := e.call("s", "write", fstools.WriteArgs{FilePath: p, Content: "pwned"})
		if code(r) != "FS_PERMISSION_DENIED" {
			t.Errorf("write %s: %s", p, text(r))
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("write escaped the workspace: %v", entries)
	}
}

func TestReadBeforeWritePolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Create needs no read.
	r := e.call("s1", "write", fstools.WriteArgs{FilePath: "sub/new.txt", Content: "v1\n"})
	wantOK(t, r)
	if !strings.Contains(text(r), "Created file") || e.content("sub/new.txt") != "v1\n" {
		t.Fatalf("create: %s", text(r))
	}
	// The writer observed its own write; another session did not.
	wantOK(t, e.call("s1", "write", fstools.WriteArgs{FilePath: "sub/new.txt", Content: "v2\n"}))
	if r := e.call("s2", "write", fstools.WriteArgs{FilePath: "sub/new.txt", Content: "x"}); code(r) != "FS_NOT_OBSERVED" {
		t.Errorf("unobserved overwrite: %s", text(r))
	}
	if r := e.call("s2", "edit", fstools.EditArgs{FilePath: "sub/new.txt", OldString: "v2", NewString: "x"}); code(r) != "FS_NOT_OBSERVED" {
		t.Errorf("unobserved edit: %s", text(r))
	}
	wantOK(t, e.call("s2", "read", fstools.ReadArgs{FilePath: "sub/new.txt"}))
	// Someone changes the file behind s2's back.
	e.file("sub/new.txt", "v3\n")
	if r := e.call("s2", "edit", fstools.EditArgs{FilePath: "sub/new.txt", OldString: "v3", NewString: "x"}); code(r) != "FS_STALE_VERSION" {
		t.Errorf("stale edit: %s", text(r))
	}
	if r := e.call("s2", "write", fstools.WriteArgs{FilePath: "sub/new.txt", Content: "x"}); code(r) != "FS_STALE_VERSION" {
		t.Errorf("stale write: %s", text(r))
	}
	wantOK(t, e.call("s2", "read", fstools.ReadArgs{FilePath: "sub/new.txt", Offset: 1, Limit: 1}))
	r = e.call("s2", "write", fstools.WriteArgs{FilePath: "sub/new.txt", Content: "v4\n"})
	wantOK(t, r)
	if !strings.Contains(text(r), "Updated file") || e.content("sub/new.txt") != "v4\n" {
		t.Errorf("update after read: %s", text(r))
	}
}

func TestEditCases(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, before string
		args         fstools.EditArgs
		after        string
		code         string
	}{
		{"unique", "a\nb\nc\n", fstools.EditArgs{OldString: "b", NewString: "B"}, "a\nB\nc\n", ""},
		{"ambiguous", "x x\n", fstools.EditArgs{OldString: "x", NewString: "y"}, "x x\n", "FS_AMBIGUOUS_EDIT"},
		{"replace all", "x x\n", fstools.EditArgs{OldString: "x", NewString: "y", ReplaceAll: true}, "y y\n", ""},
		{"not found", "abc\n", fstools.EditArgs{OldString: "zzz", NewString: "y"}, "abc\n", "FS_EDIT_NOT_FOUND"},
		{"empty old", "abc\n", fstools.EditArgs{OldString: "", NewString: "y"}, "abc\n", "INVALID_ARGS"},
		{"same strings", "abc\n", fstools.EditArgs{OldString: "a", NewString: "a"}, "abc\n", "INVALID_ARGS"},
		{"CRLF file keeps CRLF", "one\r\ntwo\r\nthree\r\n", fstools.EditArgs{OldString: "one\ntwo", NewString: "1\n2\n2.5"}, "1\r\n2\r\n2.5\r\nthree\r\n", ""},
		{"non-UTF-8 bytes survive", "caf\xe9\nkeep \xff here\n", fstools.EditArgs{OldString: "keep", NewString: "kept"}, "caf\xe9\nkept \xff here\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.file("f", tt.before)
			wantOK(t, e.call("s", "read", fstools.ReadArgs{FilePath: "f"}))
			tt.args.FilePath = "f"
			r := e.call("s", "edit", tt.args)
			if code(r) != tt.code {
				t.Fatalf("code %q, want %q: %s", code(r), tt.code, text(r))
			}
			if got := e.content("f"); got != tt.after {
				t.Errorf("file = %q, want %q", got, tt.after)
			}
		})
	}
}

func TestEditDiffView(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lines := []string{}
	for i := range 20 {
		lines = append(lines, "line"+string(rune('a'+i)))
	}
	e.file("f", strings.Join(lines, "\n")+"\n")
	wantOK(t, e.call("s", "read", fstools.ReadArgs{FilePath: "f"}))
	r := e.call("s", "edit", fstools.EditArgs{FilePath: "f", OldString: "lineb", NewString: "B1\nB2"})
	wantOK(t, r)
	p := filepath.Join(e.root, "f")
	old := "linea\nlineb\nlinec\nlined\nlinee"
	want := &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Diff{Diff: &toolsv1.DiffResultView{
		Title: p,
		Diffs: []*toolsv1.FileDiff{{Path: p, OldText: &old, NewText: "linea\nB1\nB2\nlinec\nlined\nlinee"}},
	}}}
	if diff := cmp.Diff(want, r.GetView(), protocmp.Transform()); diff != "" {
		t.Errorf("view (-want +got):\n%s", diff)
	}
	// Two distant sites give two hunks.
	wantOK(t, e.call("s", "edit", fstools.EditArgs{FilePath: "f", OldString: "line", NewString: "L", ReplaceAll: true}))
	r = e.call("s", "read", fstools.ReadArgs{FilePath: "f"})
	wantOK(t, r)
	e.file("g", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\nn\na\n")
	wantOK(t, e.call("s", "read", fstools.ReadArgs{FilePath: "g"}))
	r = e.call("s", "edit", fstools.EditArgs{FilePath: "g", OldString: "a\n", NewString: "A\n", ReplaceAll: true})
	wantOK(t, r)
	if n := len(r.GetView().GetDiff().GetDiffs()); n != 2 {
		t.Errorf("distant sites: %d hunks, want 2: %v", n, r.GetView())
	}
}

func TestConcurrentEditsExactlyOneWins(t *testing.T) {
	t.Parallel()
	for round := range 10 {
		e := newEnv(t)
		e.file("f", "counter=0\n")
		const n = 8
		for i := range n {
			wantOK(t, e.call(sessionName(i), "read", fstools.ReadArgs{FilePath: "f"}))
		}
		var wg sync.WaitGroup
		results := make([]*toolsv1.ToolExecutionResult, n)
		for i := range n {
			wg.Go(func() {
				results[i] = e.call(sessionName(i), "edit", fstools.EditArgs{FilePath: "f", OldString: "counter=0", NewString: "counter=" + sessionName(i)})
			})
		}
		wg.Wait()
		wins := 0
		for i, r := range results {
			switch code(r) {
			case "":
				wins++
				if got := e.content("f"); got != "counter="+sessionName(i)+"\n" {
					t.Errorf("round %d: winner %d but file %q", round, i, got)
				}
			case "FS_STALE_VERSION":
			default:
				t.Errorf("round %d: edit %d: %s", round, i, text(r))
			}
		}
		if wins != 1 {
			t.Errorf("round %d: %d edits won, want exactly 1", round, wins)
		}
	}
}

func sessionName(i int) string { return "s" + string(rune('A'+i)) }

func TestWriteDiffAndCallViews(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.call("s", "write", fstools.WriteArgs{FilePath: "n.txt", Content: "a\nb\n"})
	wantOK(t, r)
	p := filepath.Join(e.root, "n.txt")
	want := &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Diff{Diff: &toolsv1.DiffResultView{
		Title: p, Diffs: []*toolsv1.FileDiff{{Path: p, NewText: "a\nb\n"}},
	}}}
	if diff := cmp.Diff(want, r.GetView(), protocmp.Transform()); diff != "" {
		t.Errorf("create view (-want +got):\n%s", diff)
	}
	tool, _ := e.host.Tool("edit")
	if v := tool.PresentCall(`{"file_path":3}`); v != nil {
		t.Errorf("presenter did not soft-fail on an old argument shape: %v", v)
	}
	if v := tool.PresentCall(`{"file_path":"x","old_string":"a","new_string":"b"}`); v.GetDiff().GetDiffs()[0].GetOldText() != "a" {
		t.Errorf("edit call view: %v", v)
	}
	_ = context.Background
}
