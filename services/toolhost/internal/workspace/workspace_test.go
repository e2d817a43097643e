package workspace_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/toolhost/internal/workspace"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// tree writes files (path → content; a value "->target" makes a symlink,
// "/" a directory) under a fresh root and returns the root.
func tree(t testing.TB, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case c == "/":
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(c, "->"):
			if err := os.Symlink(strings.ReplaceAll(c[2:], "$ROOT", root), full); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// golden compares got (with root replaced by $ROOT) to testdata/name.golden.
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

func render(t *testing.T, root string, resp *toolsv1.GetWorkspaceContextResponse) string {
	t.Helper()
	resp.Version = "<version>"
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	// protojson's whitespace is unstable on purpose; normalise it.
	s := strings.ReplaceAll(string(b), ":  ", ": ")
	return strings.ReplaceAll(s, root, "$ROOT") + "\n"
}

const skillA = "---\nname: alpha\ndescription: Does alpha things.\nwhen_to_use: When alpha is needed.\n---\n# Alpha\n\nRun scripts/a.sh.\n"

func TestContextGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		cwd   string
		cfg   workspace.Config
	}{
		{name: "nesting", cwd: "repo/pkg/sub", files: map[string]string{
			"AGENTS.md":              "outside the project: never read",
			"repo/.git/HEAD":         "ref: refs/heads/main\n",
			"repo/AGENTS.md":         "root rules",
			"repo/CLAUDE.md":         "shadowed by AGENTS.md",
			"repo/pkg/CLAUDE.md":     "pkg rules from CLAUDE.md",
			"repo/pkg/sub/AGENTS.md": "sub rules",
			"repo/other/AGENTS.md":   "not on the path",
		}},
		{name: "no-git-cwd-only", cwd: "a/b", files: map[string]string{
			"a/AGENTS.md":   "not read: no .git, so the project root is cwd",
			"a/b/AGENTS.md": "cwd rules",
		}},
		{name: "caps", cwd: "sub", cfg: workspace.Config{MaxFileBytes: 10, MaxTotalBytes: 16}, files: map[string]string{
			".git":              "gitdir: elsewhere\n",
			"AGENTS.md":         "0123456789abcdef",
			"sub/AGENTS.md":     "héllo wörld",
			"sub/x/placeholder": "",
		}},
		{name: "total-exhausted", cwd: "a/b", cfg: workspace.Config{MaxFileBytes: 8, MaxTotalBytes: 8}, files: map[string]string{
			".git/HEAD":     "x",
			"AGENTS.md":     "12345678",
			"a/AGENTS.md":   "skipped",
			"a/b/AGENTS.md": "skipped too",
		}},
		{name: "bad-files", cwd: "d/e/f/g", cfg: workspace.Config{MaxReadBytes: 64}, files: map[string]string{
			".git/HEAD":         "x",
			"AGENTS.md":         "\xff\xfe not utf-8",
			"d/AGENTS.md":       strings.Repeat("x", 65),
			"d/e/AGENTS.md":     "->/etc/hostname",
			"d/e/CLAUDE.md":     "not read: AGENTS.md exists even when skipped",
			"d/e/f/AGENTS.md":   "/",
			"d/e/f/CLAUDE.md":   "not read either",
			"d/e/f/g/AGENTS.md": "->$ROOT/real.md",
			"real.md":           "a symlink inside the workspace is fine",
		}},
		{name: "skills", cwd: "repo/sub", cfg: workspace.Config{CustomSkillDirs: []string{"$ROOT/custom"}, DshHome: "$ROOT/home/.dsh", AgentsHome: "$ROOT/home/.agents"}, files: map[string]string{
			"repo/.git/HEAD":                        "x",
			"repo/sub/placeholder":                  "",
			"repo/.dsh/skills/alpha/SKILL.md":       skillA,
			"repo/.dsh/skills/alpha/scripts/a.sh":   "echo a",
			"repo/.agents/skills/alpha/SKILL.md":    "---\ndescription: shadowed by rank 100\n---\nbody",
			"repo/.agents/skills/beta.md":           "---\ndescription: Flat beta.\ndisable-model-invocation: true\n---\nbeta body",
			"repo/.agents/skills/Bad_Name/SKILL.md": "---\ndescription: bad name\n---\n",
			"repo/.agents/skills/broken/SKILL.md":   "---\ndescription: [unclosed\n---\n",
			"repo/.agents/skills/unterminated.md":   "---\ndescription: x\n",
			"repo/.agents/skills/nodesc.md":         "# no frontmatter at all",
			"repo/.agents/skills/typed.md":          "---\ndescription: x\ndisable-model-invocation: \"yes\"\n---\n",
			"repo/.agents/skills/escape/SKILL.md":   "->/etc/hostname",
			"repo/.agents/skills/notes.txt":         "not a skill",
			"repo/.agents/skills/empty-dir/x":       "no SKILL.md here",
			"repo/.agents/skills/renamed/SKILL.md":  "---\nname: gamma\ndescription: \"Named by frontmatter: <b>&</b>\"\n---\ngamma",
			"custom/delta.md":                       "---\ndescription: Custom delta.\n---\ndelta",
			"home/.dsh/skills/.system/sys/SKILL.md": "---\ndescription: skipped\n---\n",
			"home/.dsh/skills/delta.md":             "---\ndescription: shadowed by custom\n---\n",
			"home/.agents/skills/epsilon/SKILL.md":  "---\r\ndescription: CRLF epsilon.\r\n---\r\nepsilon\r\n",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := tree(t, tt.files)
			cfg := tt.cfg
			cfg.Root = root
			fix := func(s string) string { return strings.ReplaceAll(s, "$ROOT", root) }
			cfg.DshHome, cfg.AgentsHome = fix(cfg.DshHome), fix(cfg.AgentsHome)
			for i, d := range cfg.CustomSkillDirs {
				cfg.CustomSkillDirs[i] = fix(d)
			}
			r, err := workspace.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := r.Context(workspace.Bounds{}, filepath.Join(root, tt.cwd))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetVersion()) != 24 {
				t.Errorf("version %q", resp.GetVersion())
			}
			golden(t, "context-"+tt.name, render(t, root, resp))
		})
	}
}

func TestCwdOutsideRefused(t *testing.T) {
	t.Parallel()
	outer := tree(t, map[string]string{"ws/AGENTS.md": "x", "elsewhere/AGENTS.md": "secret", "ws/link": "->$ROOT/elsewhere"})
	r, err := workspace.New(workspace.Config{Root: filepath.Join(outer, "ws")})
	if err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{
		filepath.Join(outer, "elsewhere"),
		filepath.Join(outer, "ws", ".."),
		filepath.Join(outer, "ws", "link"), // a symlink out of the workspace
		filepath.Join(outer, "ws", "missing"),
		"relative/path",
		"/",
	} {
		if _, err := r.Context(workspace.Bounds{}, cwd); !errors.Is(err, workspace.ErrOutside) {
			t.Errorf("Context(%s) = %v, want ErrOutside", cwd, err)
		}
	}
	if _, err := r.Context(workspace.Bounds{}, filepath.Join(outer, "ws")); err != nil {
		t.Errorf("the root itself: %v", err)
	}
}

func TestVersionTracksContent(t *testing.T) {
	t.Parallel()
	root := tree(t, map[string]string{".git/HEAD": "x", "AGENTS.md": "one", ".agents/skills/a.md": "---\ndescription: a\n---\n"})
	r, err := workspace.New(workspace.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	v := func() string {
		resp, err := r.Context(workspace.Bounds{}, root)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVersion()
	}
	v1 := v()
	if v() != v1 {
		t.Fatal("version is not stable")
	}
	if err := os.WriteFile(filepath.Join(root, "AGENTS.md"), []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := v()
	if v2 == v1 {
		t.Fatal("editing AGENTS.md kept the version")
	}
	if err := os.WriteFile(filepath.Join(root, ".agents/skills/b.md"), []byte("---\ndescription: b\n---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v() == v2 {
		t.Fatal("adding a skill kept the version")
	}
}

func TestParseFrontmatter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		fm       workspace.Frontmatter
		body     string
		err      string
	}{
		{"none", "# title\n", workspace.Frontmatter{}, "# title\n", ""},
		{"full", "---\nname: a-b\ndescription: d\nwhen-to-use: w\ndisableModelInvocation: true\nextra: [1]\n---\n\nbody\n",
			workspace.Frontmatter{Name: "a-b", Description: "d", WhenToUse: "w", DisableModelInvocation: true}, "body\n", ""},
		{"empty block", "---\n---\nbody", workspace.Frontmatter{}, "body", ""},
		{"closing at eof", "---\ndescription: d\n---", workspace.Frontmatter{Description: "d"}, "", ""},
		{"bom and crlf", "\ufeff---\r\ndescription: d\r\n---\r\nb\r\n", workspace.Frontmatter{Description: "d"}, "b\n", ""},
		{"unterminated", "---\ndescription: d\n", workspace.Frontmatter{}, "", "no closing --- line"},
		{"bad yaml", "---\ndescription: [x\n---\n", workspace.Frontmatter{}, "", "malformed frontmatter"},
		{"not a mapping", "---\n- a\n---\n", workspace.Frontmatter{}, "", "malformed frontmatter"},
		{"wrong type", "---\ndescription: 3\n---\n", workspace.Frontmatter{}, "", "description must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fm, body, err := workspace.ParseFrontmatter([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.fm, fm); diff != "" {
				t.Errorf("frontmatter (-want +got):\n%s", diff)
			}
			if body != tt.body {
				t.Errorf("body %q, want %q", body, tt.body)
			}
		})
	}
}

func FuzzParseFrontmatter(f *testing.F) {
	f.Add([]byte(skillA))
	f.Add([]byte("---\n---"))
	f.Add([]byte("---\r\na: [\r\n---\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fm, body, err := workspace.ParseFrontmatter(b)
		if err == nil && len(body) > len(b) {
			t.Fatalf("body longer than input: %q %v", body, fm)
		}
	})
}

// TestSkillRootSymlinkOut: a project skill root that is a symlink out of
// the workspace is not read (its skills would let a repository smuggle in
// files from elsewhere on the host).
func TestSkillRootSymlinkOut(t *testing.T) {
	t.Parallel()
	outer := tree(t, map[string]string{
		"ws/.git/HEAD":            "x",
		"ws/.agents/skills":       "->$ROOT/elsewhere",
		"elsewhere/leak/SKILL.md": "---\ndescription: outside\n---\nsecret",
	})
	r, err := workspace.New(workspace.Config{Root: filepath.Join(outer, "ws")})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.Context(workspace.Bounds{}, filepath.Join(outer, "ws"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetSkills()) != 0 || len(resp.GetSkillErrors()) != 1 || !strings.Contains(resp.GetSkillErrors()[0].GetMessage(), "resolves outside the workspace") {
		t.Errorf("context %v", resp)
	}
	if _, err := r.LoadSkill(workspace.Bounds{}, filepath.Join(outer, "ws"), "leak"); err == nil {
		t.Error("the skill tool loaded a skill from outside the workspace")
	}
}

// TestSkillHomeThroughLinks: the deployment's own skill homes lie outside
// the workspace and are often assembled from links (stow, home-manager,
// `ln -s /abs/...`); a skill reached through an absolute link there is
// offered, while a workspace file linked out stays refused.
func TestSkillHomeThroughLinks(t *testing.T) {
	t.Parallel()
	outer := tree(t, map[string]string{
		"ws/.git/HEAD":               "x",
		"ws/AGENTS.md":               "->$ROOT/elsewhere/AGENTS.md",
		"elsewhere/AGENTS.md":        "outside rules",
		"store/alpha/SKILL.md":       skillA,
		"store/beta.md":              "---\ndescription: Beta.\n---\nb",
		"home/skills/alpha":          "->$ROOT/store/alpha",
		"home/skills/beta.md":        "->$ROOT/store/beta.md",
		"linkedhome/skills/gamma.md": "---\ndescription: Gamma.\n---\ng",
	})
	if err := os.Symlink(filepath.Join(outer, "linkedhome"), filepath.Join(outer, "home2")); err != nil {
		t.Fatal(err)
	}
	for _, home := range []string{"home", "home2"} {
		r, err := workspace.New(workspace.Config{Root: filepath.Join(outer, "ws"), DshHome: filepath.Join(outer, home)})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := r.Context(workspace.Bounds{}, filepath.Join(outer, "ws"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range resp.GetSkills() {
			names = append(names, s.GetName())
		}
		want := map[string][]string{"home": {"alpha", "beta"}, "home2": {"gamma"}}[home]
		if !cmp.Equal(names, want) || len(resp.GetSkillErrors()) != 0 {
			t.Errorf("%s: skills %v (want %v), errors %v", home, names, want, resp.GetSkillErrors())
		}
		if len(resp.GetInstructions()) != 0 || len(resp.GetNotices()) != 1 || !strings.Contains(resp.GetNotices()[0].GetMessage(), "resolves outside the workspace") {
			t.Errorf("%s: a workspace instruction file linked out: instructions %v, notices %v", home, resp.GetInstructions(), resp.GetNotices())
		}
	}
}

func BenchmarkContext(b *testing.B) {
	root := tree(b, map[string]string{
		".git/HEAD": "x", "AGENTS.md": strings.Repeat("rule\n", 2000), "a/b/CLAUDE.md": "more rules",
		".agents/skills/one/SKILL.md": skillA, ".agents/skills/two.md": "---\ndescription: two\n---\nx", ".dsh/skills/three.md": "---\ndescription: three\n---\nx",
	})
	r, err := workspace.New(workspace.Config{Root: root})
	if err != nil {
		b.Fatal(err)
	}
	cwd := filepath.Join(root, "a", "b")
	b.ReportAllocs()
	start, n := cputime.Process(), 0
	for b.Loop() {
		if _, err := r.Context(workspace.Bounds{}, cwd); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(n), "cpu-ns/op")
}

// TestSkillBounds: LoadSkill confined to a session's root inside the
// host's reads that root's skills only — not those of the host root's
// project (its .git lies above the session root), not those of a sibling
// reached through a link in the session root — and refuses bounds that are
// not inside the host's root at all.
func TestSkillBounds(t *testing.T) {
	t.Parallel()
	outer := tree(t, map[string]string{
		"ws/.git/HEAD":               "x",
		"ws/.agents/skills/host.md":  "---\ndescription: host\n---\nHOST-CANARY",
		"ws/a/.agents/skills/own.md": "---\ndescription: own\n---\nown",
		"ws/a/to-b":                  "->$ROOT/ws/b",
		"ws/b/.git/HEAD":             "x",
		"ws/b/.agents/skills/sib.md": "---\ndescription: sib\n---\nSIB-CANARY",
		"elsewhere/.git/HEAD":        "x",
	})
	ws, err := filepath.EvalSymlinks(filepath.Join(outer, "ws"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := workspace.New(workspace.Config{Root: ws})
	if err != nil {
		t.Fatal(err)
	}
	a := workspace.Bounds{Root: filepath.Join(ws, "a"), Real: filepath.Join(ws, "a")}
	if s, err := r.LoadSkill(a, a.Root, "own"); err != nil || s.Body != "own" {
		t.Errorf("own skill in the session root: %v %v", s, err)
	}
	if s, err := r.LoadSkill(workspace.Bounds{}, a.Root, "host"); err != nil || s.Body != "HOST-CANARY" {
		t.Errorf("the host root's bounds: %v %v (want the host project's skill)", s, err)
	}
	for _, c := range []struct {
		b         workspace.Bounds
		cwd, name string
	}{
		{a, a.Root, "host"},
		{a, filepath.Join(a.Root, "to-b"), "sib"},
		{workspace.Bounds{Root: filepath.Join(outer, "elsewhere"), Real: filepath.Join(outer, "elsewhere")}, filepath.Join(outer, "elsewhere"), "x"},
	} {
		s, err := r.LoadSkill(c.b, c.cwd, c.name)
		if err == nil {
			t.Errorf("bounds %v, cwd %s: loaded %q, want a refusal", c.b, c.cwd, s.Body)
		}
	}
}
