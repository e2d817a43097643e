package sandbox

import (
	"os"
	"strings"
)

// listOutside lists what read access to the whole filesystem except the
// hidden roots is granted on. Landlock only allows, so "everything but H"
// is spelled as the siblings of every directory on the way from / down to
// each H. Symlinks are skipped: a rule on a link would grant its target
// (which may be hidden), and every real target is reached by its own path
// anyway. walked are the directories listed, stamped before their
// listing: the list describes them as they were then (see stamp).
func listOutside(hidden []string) (dirs, files []string, walked []stamped, err error) {
	if len(hidden) == 0 {
		return []string{"/"}, nil, nil, nil
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		st, err := stamp(dir)
		if err != nil {
			return err
		}
		walked = append(walked, stamped{dir, st})
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
		return nil, nil, nil, err
	}
	return dirs, files, walked, nil
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
