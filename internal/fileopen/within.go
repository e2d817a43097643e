package fileopen

import (
	"path/filepath"
	"strings"
)

// Within reports whether path is root or lies under it, lexically: both are
// cleaned first, so "/ws/a/../b" is not within "/ws/a". It resolves no link
// (resolve first, or open with links refused, where the file system
// matters); a relative path is never within an absolute root, nor the other
// way round.
func Within(path, root string) bool {
	path, root = filepath.Clean(path), filepath.Clean(root)
	if path == root {
		return true
	}
	if filepath.IsAbs(path) != filepath.IsAbs(root) {
		return false
	}
	if !filepath.IsAbs(root) {
		// Relative paths may climb ("..") or name the current directory
		// ("."): read them as filepath.Rel does.
		rel, err := filepath.Rel(root, path)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	if root == string(filepath.Separator) {
		return true
	}
	return strings.HasPrefix(path, root+string(filepath.Separator))
}
