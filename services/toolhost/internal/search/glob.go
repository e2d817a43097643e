// Package search holds the built-in glob and grep tools: pure Go walks of the
// workspace (no ripgrep needed) that skip VCS folders, include hidden files,
// never follow directory symlinks, and cap their inline results, spilling
// the full list to a private file the result names. grep honours .gitignore
// files (from the workspace root down, as ripgrep does); glob lists ignored
// files too, as the original did.
package search

import (
	"fmt"
	"regexp"
	"strings"
)

// compileGlob turns a glob into an anchored regexp over slash-separated
// relative paths: ** spans directories, * and ? stay inside one, [...] is a
// class ([!...] negated), {a,b} alternates, \ escapes.
func compileGlob(pat string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	depth := 0
	for i := 0; i < len(pat); i++ {
		c := pat[i]
		switch c {
		case '*':
			if i+1 < len(pat) && pat[i+1] == '*' {
				i++
				if i+1 < len(pat) && pat[i+1] == '/' {
					i++
					b.WriteString("(?:.*/)?")
				} else {
					b.WriteString(".*")
				}
			} else {
				b.WriteString("[^/]*")
			}
		case '?':
			b.WriteString("[^/]")
		case '[':
			j := strings.IndexByte(pat[i+1:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated [ in glob %q", pat)
			}
			class := pat[i+1 : i+1+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j + 1
		case '{':
			depth++
			b.WriteString("(?:")
		case '}':
			if depth == 0 {
				b.WriteString(`\}`)
				continue
			}
			depth--
			b.WriteString(")")
		case ',':
			if depth > 0 {
				b.WriteString("|")
			} else {
				b.WriteString(",")
			}
		case '\\':
			if i+1 < len(pat) {
				i++
				b.WriteString(regexp.QuoteMeta(string(pat[i])))
			}
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("unterminated { in glob %q", pat)
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// matcher matches a glob against a relative path; a glob without a slash
// matches the base name at any depth.
type matcher struct {
	re       *regexp.Regexp
	basename bool
}

func newMatcher(pat string) (*matcher, error) {
	pat = strings.TrimPrefix(pat, "./")
	re, err := compileGlob(pat)
	if err != nil {
		return nil, err
	}
	return &matcher{re: re, basename: !strings.Contains(pat, "/")}, nil
}

func (m *matcher) match(rel string) bool {
	if m.basename {
		if i := strings.LastIndexByte(rel, '/'); i >= 0 {
			rel = rel[i+1:]
		}
	}
	return m.re.MatchString(rel)
}
