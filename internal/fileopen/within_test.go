package fileopen

import (
	"path/filepath"
	"strings"
	"testing"
)

// withinByRel is the filepath.Rel reading of Within, the one the toolhost's
// copies used: path is within root when its relative path does not climb.
func withinByRel(path, root string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

func TestWithin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		path, root string
		want       bool
	}{
		{"/ws/a", "/ws/a", true},
		{"/ws/a/b", "/ws/a", true},
		{"/ws/a/b", "/ws/a/", true},
		{"/ws/ab", "/ws/a", false}, // a sibling sharing the prefix
		{"/ws/a/../b", "/ws/a", false},
		{"/ws/a/./b/", "/ws/a", true},
		{"/ws", "/ws/a", false},
		{"/anything", "/", true},
		{"/", "/", true},
		{"a/b", "/a", false},
		{"/a/b", "a", false},
		{"a/b", "a", true},
		{"..", ".", false},
		{"../../x", "..", false},
		{"../..", "..", false},
		{"../a/../../b", "..", false},
		{"a", ".", true},
		{"a", "", true},
	} {
		if got := Within(tt.path, tt.root); got != tt.want {
			t.Errorf("Within(%q, %q) = %v, want %v", tt.path, tt.root, got, tt.want)
		}
		if ref := withinByRel(tt.path, tt.root); ref != tt.want {
			t.Errorf("the Rel reference says %v for (%q, %q)", ref, tt.path, tt.root)
		}
	}
}

// FuzzWithin checks Within against the filepath.Rel reading on any pair of
// absolute paths, and of relative ones.
func FuzzWithin(f *testing.F) {
	for _, s := range [][2]string{{"/ws/a/b", "/ws/a"}, {"/ws/ab", "/ws/a"}, {"/ws/a/../b", "/ws/a"}, {"/x", "/"}, {"//a//b/", "/a"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, path, root string) {
		if got, want := Within("/"+path, "/"+root), withinByRel("/"+path, "/"+root); got != want {
			t.Fatalf("Within(%q, %q) = %v, the Rel reading %v", "/"+path, "/"+root, got, want)
		}
		if filepath.IsAbs(path) || filepath.IsAbs(root) {
			return
		}
		if got, want := Within(path, root), withinByRel(path, root); got != want {
			t.Fatalf("Within(%q, %q) = %v, the Rel reading %v", path, root, got, want)
		}
	})
}
