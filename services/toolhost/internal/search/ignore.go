package search

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ignoreRule is one .gitignore line.
type ignoreRule struct {
	re      *regexp.Regexp
	negate  bool
	dirOnly bool
	base    bool // no slash: match the base name at any depth
}

// ignoreSet holds the .gitignore rules met during a walk, keyed by the
// absolute directory they came from.
// It implements the common subset of gitignore: comments, blank lines,
// negation with !, trailing / for directories, a leading or inner / to
// anchor, and *, ?, [..], ** wildcards. The last matching rule wins, inner
// files after outer ones.
type ignoreSet struct {
	dirs  []string
	rules map[string][]ignoreRule
	// open opens a .gitignore (the walk's tree).
	open func(path string) (*os.File, error)
}

// newIgnoreSet is an empty set whose .gitignore files open with open (the
// walk's tree: never outside it, never blocking on a FIFO).
func newIgnoreSet(open func(path string) (*os.File, error)) *ignoreSet {
	return &ignoreSet{rules: map[string][]ignoreRule{}, open: open}
}

// load reads dir/.gitignore (dir absolute) if present. Call it for outer
// directories before inner ones.
func (s *ignoreSet) load(dir string) {
	f, err := s.open(filepath.Join(dir, ".gitignore"))
	if err != nil {
		return
	}
	defer f.Close()
	var rules []ignoreRule
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var r ignoreRule
		if strings.HasPrefix(line, "!") {
			r.negate, line = true, line[1:]
		} else if strings.HasPrefix(line, `\`) {
			line = line[1:]
		}
		if strings.HasSuffix(line, "/") {
			r.dirOnly, line = true, strings.TrimRight(line, "/")
		}
		r.base = !strings.Contains(line, "/")
		line = strings.TrimPrefix(line, "/")
		if line == "" {
			continue
		}
		re, err := compileGlob(line)
		if err != nil {
			continue
		}
		r.re = re
		rules = append(rules, r)
	}
	if len(rules) > 0 {
		s.dirs = append(s.dirs, dir)
		s.rules[dir] = rules
	}
}

// ignored reports whether the absolute path p is excluded.
func (s *ignoreSet) ignored(p string, isDir bool) bool {
	out := false
	for _, dir := range s.dirs {
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			continue
		}
		sub := filepath.ToSlash(rel)
		for _, r := range s.rules[dir] {
			if r.dirOnly && !isDir {
				continue
			}
			target := sub
			if r.base {
				target = sub[strings.LastIndexByte(sub, '/')+1:]
			}
			if r.re.MatchString(target) {
				out = !r.negate
			}
		}
	}
	return out
}
