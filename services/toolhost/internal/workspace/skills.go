package workspace

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen"
)

// skillNamePattern is the kebab-case rule of skill names, compiled on first
// use (not at every start of a program that links the toolhost).
var skillNamePattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]+(?:-[a-z0-9]+)*$`) })

// Skill sources (the roots of semantics.md §7.8).
const (
	SourceProjectDsh    = "project-dsh"
	SourceProjectAgents = "project-agents"
	SourceCustom        = "custom"
	SourceDshHome       = "dsh-home"
	SourceAgentsHome    = "agents-home"
	// Provider is the provider name of the file roots.
	Provider = "local"
)

// skillRoot is one directory of skills.
type skillRoot struct {
	dir     string
	rank    int32
	source  string
	project bool // must resolve inside the workspace
}

// roots lists the skill roots by rank.
func (r *Reader) roots(project string) []skillRoot {
	rs := []skillRoot{
		{filepath.Join(project, ".dsh", "skills"), 100, SourceProjectDsh, true},
		{filepath.Join(project, ".agents", "skills"), 200, SourceProjectAgents, true},
	}
	for _, d := range r.cfg.CustomSkillDirs {
		rs = append(rs, skillRoot{d, 300, SourceCustom, false})
	}
	if r.cfg.DshHome != "" {
		rs = append(rs, skillRoot{filepath.Join(r.cfg.DshHome, "skills"), 400, SourceDshHome, false})
	}
	if r.cfg.AgentsHome != "" {
		rs = append(rs, skillRoot{filepath.Join(r.cfg.AgentsHome, "skills"), 500, SourceAgentsHome, false})
	}
	return rs
}

// Skill is one loaded skill: its summary and its markdown body.
type Skill struct {
	Summary *toolsv1.SkillSummary
	Body    string
}

// catalog is the resolved skill set of a project root.
type catalog struct {
	skills []*Skill // sorted by name, one per name
	errors []*toolsv1.WorkspaceNotice
}

func (c *catalog) summaries() []*toolsv1.SkillSummary {
	out := make([]*toolsv1.SkillSummary, len(c.skills))
	for i, s := range c.skills {
		out[i] = s.Summary
	}
	return out
}

func (c *catalog) find(name string) *Skill {
	i, ok := slices.BinarySearchFunc(c.skills, name, func(s *Skill, n string) int { return strings.Compare(s.Summary.GetName(), n) })
	if !ok {
		return nil
	}
	return c.skills[i]
}

// catalog walks the roots in rank order; a name already taken by a lower
// rank (or earlier in the same root) is shadowed and said so.
func (r *Reader) catalog(project string) *catalog {
	c := &catalog{}
	byName := map[string]*Skill{}
	fail := func(path, format string, args ...any) {
		c.errors = append(c.errors, &toolsv1.WorkspaceNotice{Path: path, Message: fmt.Sprintf(format, args...)})
	}
	for _, root := range r.roots(project) {
		fi, err := os.Stat(root.dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		real, ok := r.checkSkillRoot(root)
		if !ok {
			fail(root.dir, "skill root skipped: it is a symlink that resolves outside the workspace")
			continue
		}
		ents, err := r.listSkillRoot(root, real)
		if err != nil {
			fail(root.dir, "skill root unreadable: %v", err)
			continue
		}
		for _, e := range ents {
			entry := e.Name()
			if strings.HasPrefix(entry, ".") { // .system and hidden entries
				continue
			}
			path, base := filepath.Join(root.dir, entry, "SKILL.md"), filepath.Join(root.dir, entry)
			if !isDir(filepath.Join(root.dir, entry)) {
				if !strings.HasSuffix(entry, ".md") {
					continue
				}
				path, base, entry = filepath.Join(root.dir, entry), root.dir, strings.TrimSuffix(entry, ".md")
			} else if _, err := os.Lstat(path); err != nil {
				continue
			}
			s, err := r.loadSkill(root, path, base, entry)
			if err != nil {
				fail(path, "skill not offered: %v", err)
				continue
			}
			name := s.Summary.GetName()
			if prev, dup := byName[name]; dup {
				fail(path, "skill %q not offered: shadowed by %s (rank %d)", name, prev.Summary.GetPath(), prev.Summary.GetRank())
				continue
			}
			byName[name] = s
			c.skills = append(c.skills, s)
		}
	}
	slices.SortFunc(c.skills, func(a, b *Skill) int { return strings.Compare(a.Summary.GetName(), b.Summary.GetName()) })
	return c
}

// checkSkillRoot resolves a project skill root and reports whether it lies
// inside the workspace (a root of the deployment's is not checked).
func (r *Reader) checkSkillRoot(root skillRoot) (real string, ok bool) {
	if !root.project {
		return root.dir, true
	}
	real, err := fileopen.EvalSymlinks(root.dir)
	if err != nil || (!r.cfg.Unconfined && !fileopen.Within(real, r.realRoot)) {
		return "", false
	}
	return real, true
}

// listSkillRoot lists a skill root; a project one, resolved to real by
// checkSkillRoot, through an *os.Root of the workspace, so a root swapped
// for a link out after the check cannot list an outside directory's names.
func (r *Reader) listSkillRoot(root skillRoot, real string) ([]fs.DirEntry, error) {
	if !root.project {
		return os.ReadDir(root.dir)
	}
	confine := r.realRoot
	if r.cfg.Unconfined {
		confine = ""
	}
	rr, rel, err := fileopen.OpenRoot(confine, real)
	if err != nil {
		return nil, err
	}
	defer rr.Close()
	return fileopen.ReadDirIn(rr, rel)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// loadSkill reads and validates one skill file.
func (r *Reader) loadSkill(root skillRoot, path, base, entry string) (*Skill, error) {
	b, err := r.readFile(path, root.project)
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("not UTF-8 text")
	}
	fm, body, err := ParseFrontmatter(b)
	if err != nil {
		return nil, err
	}
	name := entry
	if fm.Name != "" {
		name = fm.Name
	}
	if !skillNamePattern().MatchString(name) {
		return nil, fmt.Errorf("name %q is not kebab-case (%s)", name, skillNamePattern())
	}
	if strings.TrimSpace(fm.Description) == "" {
		return nil, fmt.Errorf("frontmatter has no description")
	}
	return &Skill{Body: body, Summary: &toolsv1.SkillSummary{
		Name: name, Description: strings.TrimSpace(fm.Description), WhenToUse: strings.TrimSpace(fm.WhenToUse),
		DisableModelInvocation: fm.DisableModelInvocation, Source: root.source, Provider: Provider,
		ResourceBase: &toolsv1.SkillResourceBase{Kind: &toolsv1.SkillResourceBase_Directory{Directory: base}},
		Path:         path, Rank: root.rank,
	}}, nil
}

// Frontmatter is the part of a skill's YAML frontmatter dsh reads.
type Frontmatter struct {
	Name                   string
	Description            string
	WhenToUse              string
	DisableModelInvocation bool
}

// frontmatterKeys maps each accepted spelling to its field.
var frontmatterKeys = map[string]string{
	"name": "name", "description": "description",
	"when_to_use": "when", "when-to-use": "when", "whenToUse": "when",
	"disable-model-invocation": "disable", "disable_model_invocation": "disable", "disableModelInvocation": "disable",
}

// ParseFrontmatter splits a markdown file into its YAML frontmatter (between
// a first line "---" and the next "---" line) and its body. A file without
// frontmatter has an empty one; an unterminated block, YAML that is not a
// mapping, or a known key of the wrong type is an error.
func ParseFrontmatter(b []byte) (Frontmatter, string, error) {
	var fm Frontmatter
	b = bytes.TrimPrefix(b, []byte("\ufeff"))
	text := strings.ReplaceAll(string(b), "\r\n", "\n")
	if !strings.HasPrefix(text, "---\n") {
		return fm, text, nil
	}
	rest := text[4:]
	var block, body string
	switch {
	case strings.HasPrefix(rest, "---\n") || rest == "---":
		block, body = "", strings.TrimPrefix(strings.TrimPrefix(rest, "---"), "\n")
	default:
		end := strings.Index(rest, "\n---\n")
		if end < 0 {
			if !strings.HasSuffix(rest, "\n---") {
				return fm, "", fmt.Errorf("malformed frontmatter: no closing --- line")
			}
			end = len(rest) - 4
			block, body = rest[:end], ""
		} else {
			block, body = rest[:end], rest[end+5:]
		}
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(block), &m); err != nil {
		return fm, "", fmt.Errorf("malformed frontmatter: %v", err)
	}
	for k, v := range m {
		field, ok := frontmatterKeys[k]
		if !ok {
			continue
		}
		switch field {
		case "disable":
			bv, ok := v.(bool)
			if !ok {
				return fm, "", fmt.Errorf("malformed frontmatter: %s must be true or false", k)
			}
			fm.DisableModelInvocation = bv
		default:
			sv, ok := v.(string)
			if !ok {
				return fm, "", fmt.Errorf("malformed frontmatter: %s must be a string", k)
			}
			switch field {
			case "name":
				fm.Name = sv
			case "description":
				fm.Description = sv
			case "when":
				fm.WhenToUse = sv
			}
		}
	}
	return fm, strings.TrimLeft(body, "\n"), nil
}
