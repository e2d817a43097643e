package launcher

import (
	"os"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
)

// readRules grants read access to the whole filesystem except the hidden
// roots. Landlock only allows, so "everything but H" is spelled as the
// siblings of every directory on the way from / down to each H. Symlinks
// are skipped: a rule on a link would grant its target (which may be
// hidden), and every real target is reached by its own path anyway.
func readRules(hidden []string) ([]landlock.Rule, error) {
	if len(hidden) == 0 {
		return []landlock.Rule{landlock.RODirs("/")}, nil
	}
	var dirs, files []string
	var walk func(dir string) error
	walk = func(dir string) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			p := strings.TrimSuffix(dir, "/") + "/" + e.Name()
			switch {
			case isHidden(p, hidden):
				continue
			case leadsToHidden(p, hidden):
				if err := walk(p); err != nil {
					return err
				}
				continue
			}
			switch e.Type() {
			case os.ModeSymlink:
			case os.ModeDir:
				dirs = append(dirs, p)
			default:
				files = append(files, p)
			}
		}
		return nil
	}
	if err := walk("/"); err != nil {
		return nil, err
	}
	var rules []landlock.Rule
	if len(dirs) > 0 {
		rules = append(rules, landlock.RODirs(dirs...).IgnoreIfMissing())
	}
	if len(files) > 0 {
		rules = append(rules, landlock.ROFiles(files...).IgnoreIfMissing())
	}
	return rules, nil
}

func isHidden(p string, hidden []string) bool {
	for _, h := range hidden {
		if p == h {
			return true
		}
	}
	return false
}

// leadsToHidden reports whether some hidden root lies strictly below p.
func leadsToHidden(p string, hidden []string) bool {
	for _, h := range hidden {
		if h != p && within(h, p) {
			return true
		}
	}
	return false
}

// within reports whether p is root or lies under it (both clean, absolute).
func within(p, root string) bool {
	if p == root || root == "/" {
		return true
	}
	return strings.HasPrefix(p, root+"/")
}
