package search

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
	"github.com/dsh-dev/dsh/services/toolhost/internal/spill"
)

// Caps of the inline results (the original's).
const (
	GlobInline   = 100
	GrepInline   = 250
	maxLineChars = 2000
	maxGrepFile  = 64 << 20
	maxCollected = 200000
)

var vcsDirs = map[string]bool{".git": true, ".hg": true, ".svn": true, ".jj": true, ".bzr": true, "_darcs": true, "CVS": true}

// Search is the glob and grep tool family.
type Search struct {
	conf  *fstools.Confiner
	spill *spill.Dir
}

// New returns the search tools; sp may be nil (no spilling).
func New(conf *fstools.Confiner, sp *spill.Dir) *Search { return &Search{conf: conf, spill: sp} }

// Tools returns glob and grep.
func (s *Search) Tools() []toolsdk.Tool { return []toolsdk.Tool{s.globTool(), s.grepTool()} }

// GlobArgs are glob's parameters.
type GlobArgs struct {
	Pattern string `json:"pattern" jsonschema:"required,description=Glob to match, e.g. **/*.go or src/**/*.{ts,tsx}; a pattern without a slash matches file names at any depth."`
	Path    string `json:"path" jsonschema:"description=Directory to search (default: the session's working directory)."`
}

// GrepArgs are grep's parameters.
type GrepArgs struct {
	Pattern string `json:"pattern" jsonschema:"required,description=Regular expression (RE2 syntax) to search file contents for."`
	Path    string `json:"path" jsonschema:"description=Directory or file to search (default: the session's working directory)."`
	Include string `json:"include" jsonschema:"description=Only search files matching this glob, e.g. *.go or *.{ts,tsx}."`
}

type countMeta struct {
	Count int `json:"count"`
	Files int `json:"files"`
}

func searchView(title, pattern, path string) *toolsv1.ToolCallView {
	g := &toolsv1.GenericCallView{Title: title + " " + pattern, Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_SEARCH, RawInput: pattern}
	if path != "" {
		g.Locations = []*toolsv1.FileLocation{{Path: path}}
	}
	return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: g}}
}

func countView(r *toolsv1.ToolExecutionResult, format func(countMeta) string) *toolsv1.ToolResultView {
	var m countMeta
	if r.GetIsError() || r.Meta == nil || jsonUnmarshal(r.GetMeta(), &m) != nil {
		return nil
	}
	return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: format(m)}}}
}

func (s *Search) globTool() toolsdk.Tool {
	return toolsdk.Define("glob",
		fmt.Sprintf("Find files by glob pattern. Returns matching paths, newest first, hidden and ignored files included, VCS folders skipped; the first %d inline and the full list in a file named in the result.", GlobInline),
		s.glob,
		toolsdk.AlwaysConcurrencySafe(),
		toolsdk.PresentCall(func(a GlobArgs) *toolsv1.ToolCallView { return searchView("Glob", a.Pattern, a.Path) }),
		toolsdk.PresentResult(func(_ GlobArgs, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			return countView(r, func(m countMeta) string { return fmt.Sprintf("%d files", m.Count) })
		}),
	)
}

func (s *Search) grepTool() toolsdk.Tool {
	return toolsdk.Define("grep",
		fmt.Sprintf("Search file contents with a regular expression (Go RE2 syntax). Returns matching lines with line numbers grouped by file, newest files first; files ignored by .gitignore, binary files and VCS folders are skipped; the first %d matches inline and the rest in a file named in the result.", GrepInline),
		s.grep,
		toolsdk.AlwaysConcurrencySafe(),
		toolsdk.PresentCall(func(a GrepArgs) *toolsv1.ToolCallView { return searchView("Grep", a.Pattern, a.Path) }),
		toolsdk.PresentResult(func(_ GrepArgs, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			return countView(r, func(m countMeta) string { return fmt.Sprintf("%d matches in %d files", m.Count, m.Files) })
		}),
	)
}

type file struct {
	path  string // display path
	real  string
	mtime time.Time
}

// tree is what a walk reads through: an os.Root of the call's confinement
// root, so the walk, the .gitignore files and every file grep opens stay
// inside it however the tree changes under the walk (a directory swapped
// for a link to elsewhere is refused, not followed; a FIFO swapped in for
// a directory or a file is skipped, never waited on). It is the walk's
// fs.FS: ReadDir and Stat never open a path with a blocking open.
type tree struct {
	r    *os.Root
	base string // the real path r is open at
}

func openTree(t fstools.Target) (*tree, error) {
	r, _, err := fileopen.OpenRoot(t.Root, t.Real)
	if err != nil {
		return nil, t.IOError("open", err)
	}
	return &tree{r: r, base: r.Name()}, nil
}

func (tr *tree) Close() error { return tr.r.Close() }

// rel is real (absolute, at or under base) as a path of tr's FS.
func (tr *tree) rel(real string) string {
	rel, err := filepath.Rel(tr.base, real)
	if err != nil {
		return real // not under base: the Root refuses it
	}
	return filepath.ToSlash(rel)
}

// open opens the regular file at real for reading, never outside the tree
// and never blocking on a FIFO, with its FileInfo (from the open file);
// anything else is an error.
func (tr *tree) open(real string) (*os.File, fs.FileInfo, error) {
	f, err := fileopen.Beneath(tr.base, real)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: not a regular file", real)
	}
	return f, fi, nil
}

// openFile is open without the FileInfo: the ignore set's opener.
func (tr *tree) openFile(real string) (*os.File, error) {
	f, _, err := tr.open(real)
	return f, err
}

// Open, ReadDir and Stat make tr the walk's fs.FS (names are slash paths
// relative to base). Open is there for the interface; the walk lists with
// ReadDir and stats with Stat.
func (tr *tree) Open(name string) (fs.File, error) {
	return fileopen.In(tr.r, filepath.FromSlash(name))
}

func (tr *tree) ReadDir(name string) ([]fs.DirEntry, error) {
	return fileopen.ReadDirIn(tr.r, filepath.FromSlash(name))
}

func (tr *tree) Stat(name string) (fs.FileInfo, error) { return tr.r.Stat(filepath.FromSlash(name)) }

// walk lists the regular files under root (or root itself when it is a
// file) accepted by keep, newest first. With ign, .gitignore files from
// stop (the workspace root) down to every walked directory exclude paths.
func walk(ctx context.Context, tr *tree, root fstools.Target, keep func(rel string) bool, ign *ignoreSet, stop string) ([]file, error) {
	start := tr.rel(root.Real)
	fi, err := tr.r.Stat(start)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, toolsdk.NewError("FsError", fstools.CodeNotFound, "path not found: "+root.Display, nil)
	}
	if err != nil {
		return nil, root.IOError("stat", fileopen.Escapes(err))
	}
	if ign != nil {
		var chain []string
		for d := filepath.Dir(root.Real); fileopen.Within(d, stop) && d != root.Real; d = filepath.Dir(d) {
			chain = append(chain, d)
			if d == stop || d == filepath.Dir(d) {
				break
			}
		}
		for i := len(chain) - 1; i >= 0; i-- {
			ign.load(chain[i])
		}
	}
	var out []file
	if !fi.IsDir() {
		if keep(filepath.Base(root.Real)) {
			out = append(out, file{root.Display, root.Real, fi.ModTime()})
		}
		return out, nil
	}
	err = fs.WalkDir(tr, start, func(rp string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable entries (and links swapped in that leave the tree) are skipped
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p := filepath.Join(tr.base, filepath.FromSlash(rp))
		if d.IsDir() {
			if p != root.Real && (vcsDirs[d.Name()] || ign != nil && ign.ignored(p, true)) {
				return fs.SkipDir
			}
			if ign != nil {
				ign.load(p)
			}
			return nil
		}
		if !d.Type().IsRegular() || ign != nil && ign.ignored(p, false) {
			return nil
		}
		rel, _ := filepath.Rel(root.Real, p)
		rel = filepath.ToSlash(rel)
		if !keep(rel) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		out = append(out, file{filepath.Join(root.Display, rel), p, info.ModTime()})
		if len(out) >= maxCollected {
			return errCollected
		}
		return nil
	})
	if err != nil && !errors.Is(err, errCollected) {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b file) int {
		if c := b.mtime.Compare(a.mtime); c != 0 {
			return c
		}
		return strings.Compare(a.path, b.path)
	})
	return out, nil
}

var errCollected = errors.New("collected enough")

// stopDir is the outermost directory whose .gitignore applies: the real
// root the search's target t was confined to (the root the host vetted for
// the call, its own real root when the call sends none, or the spill
// directory for a path in it), with no second look-up. An unconfined
// target has none: then the scope's root, else the call's root resolved
// here.
func (s *Search) stopDir(call *toolsdk.Call, t fstools.Target) string {
	if t.Root != "" {
		return t.Root
	}
	if s.conf.Scope != nil {
		if sc, err := s.conf.Scope(call); err == nil && sc.Root != "" {
			return sc.Root
		}
	}
	r := call.WorkspaceRoot
	if r == "" {
		r = s.conf.Root
	}
	if real, err := filepath.EvalSymlinks(r); err == nil {
		return real
	}
	return r
}

func (s *Search) root(call *toolsdk.Call, p string) (fstools.Target, error) {
	if p == "" {
		p = call.Cwd
	}
	return s.conf.ResolveCall(call, p, false)
}

func (s *Search) glob(ctx context.Context, call *toolsdk.Call, a GlobArgs) (toolsdk.Result, error) {
	m, err := newMatcher(a.Pattern)
	if err != nil {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{`"pattern" is not a valid glob: ` + err.Error()}}
	}
	root, err := s.root(call, a.Path)
	if err != nil {
		return toolsdk.Result{}, err
	}
	tr, err := openTree(root)
	if err != nil {
		return toolsdk.Result{}, err
	}
	defer tr.Close()
	files, err := walk(ctx, tr, root, m.match, nil, "")
	if err != nil {
		return toolsdk.Result{}, searchErr(ctx, err)
	}
	if len(files) == 0 {
		res := toolsdk.Text("No files found")
		res.Meta = countMeta{}
		return res, nil
	}
	lines := make([]string, len(files))
	for i, f := range files {
		lines[i] = f.path
	}
	var b strings.Builder
	b.WriteString(strings.Join(lines[:min(len(lines), GlobInline)], "\n"))
	if len(lines) > GlobInline {
		path := s.spillText(call, "glob.txt", strings.Join(lines, "\n")+"\n")
		fmt.Fprintf(&b, "\n\n(Results are truncated: showing the first %d of %d files. Full list: %s)", GlobInline, len(lines), path)
	}
	res := toolsdk.Text(b.String())
	res.Meta = countMeta{Count: len(files), Files: len(files)}
	return res, nil
}

func (s *Search) spillText(call *toolsdk.Call, name, content string) string {
	if s.spill == nil {
		return "(unavailable)"
	}
	p, err := s.spill.WriteText(call.SessionID, call.ID+"-"+name, content)
	if err != nil {
		return "(unavailable)"
	}
	return p
}

func searchErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (s *Search) grep(ctx context.Context, call *toolsdk.Call, a GrepArgs) (toolsdk.Result, error) {
	var bad []string
	re, err := regexp.Compile(a.Pattern)
	if err != nil {
		bad = append(bad, `"pattern" is not a valid regular expression: `+err.Error())
	}
	keep := func(string) bool { return true }
	if a.Include != "" {
		m, err := newMatcher(a.Include)
		if err != nil {
			bad = append(bad, `"include" is not a valid glob: `+err.Error())
		} else {
			keep = m.match
		}
	}
	if len(bad) > 0 {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: bad}
	}
	root, err := s.root(call, a.Path)
	if err != nil {
		return toolsdk.Result{}, err
	}
	tr, err := openTree(root)
	if err != nil {
		return toolsdk.Result{}, err
	}
	defer tr.Close()
	files, err := walk(ctx, tr, root, keep, newIgnoreSet(tr.openFile), s.stopDir(call, root))
	if err != nil {
		return toolsdk.Result{}, searchErr(ctx, err)
	}
	var full, inline strings.Builder
	total, nfiles := 0, 0
	for _, f := range files {
		if ctx.Err() != nil {
			return toolsdk.Result{}, ctx.Err()
		}
		ms := grepFile(tr, f.real, re)
		if len(ms) == 0 {
			continue
		}
		nfiles++
		for _, out := range []*strings.Builder{&full, &inline} {
			if out == &inline && total >= GrepInline {
				continue
			}
			if out.Len() > 0 {
				out.WriteString("\n")
			}
			out.WriteString(f.path + ":\n")
		}
		for _, m := range ms {
			line := fmt.Sprintf("  Line %d: %s\n", m.n, m.text)
			full.WriteString(line)
			if total < GrepInline {
				inline.WriteString(line)
			}
			total++
		}
	}
	if total == 0 {
		res := toolsdk.Text("No files found")
		res.Meta = countMeta{}
		return res, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Found %d matches\n%s", total, strings.TrimRight(inline.String(), "\n"))
	if total > GrepInline {
		path := s.spillText(call, "grep.txt", full.String())
		fmt.Fprintf(&b, "\n\n(Results are truncated: showing the first %d of %d matches. Full results: %s)", GrepInline, total, path)
	}
	res := toolsdk.Text(b.String())
	res.Meta = countMeta{Count: total, Files: nfiles}
	return res, nil
}

type match struct {
	n    int
	text string
}

// grepFile returns the matching lines of a text file; binary, unreadable,
// oversized and no longer regular files yield none.
func grepFile(tr *tree, p string, re *regexp.Regexp) []match {
	f, fi, err := tr.open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi.Size() > maxGrepFile {
		return nil
	}
	br := bufio.NewReaderSize(f, 64<<10)
	head, _ := br.Peek(8000)
	if bytes.IndexByte(head, 0) >= 0 {
		return nil
	}
	var out []match
	n := 0
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			n++
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			if re.Match(line) {
				out = append(out, match{n, clip(line)})
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return out
			}
			return out
		}
	}
}

func clip(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if utf8.RuneCountInString(s) > maxLineChars {
		s = string([]rune(s)[:maxLineChars]) + "..."
	}
	return s
}
