//go:build !linux

package fileopen

import (
	"errors"
	"os"
)

// openNoLinks has no one-call form here: the caller takes the Root's way.
func openNoLinks(string) (*os.File, bool, error) { return nil, false, nil }

// NoLinks cannot answer in one call here: false, the caller resolves the
// path the long way.
func NoLinks(string) bool { return false }

// NoLinksDir is NoLinks for a directory: false here too.
func NoLinksDir(string) bool { return false }

// rootAtPath cannot check the root's path in one call here: os.OpenRoot's
// answer stands.
func rootAtPath(*os.Root, string) error { return nil }

// DirNoLinks cannot refuse links in one call here.
func DirNoLinks(string) (int, error) { return -1, errors.ErrUnsupported }
