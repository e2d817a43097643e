//go:build !linux

package fileopen

import "os"

// openNoLinks has no one-call form here: the caller takes the Root's way.
func openNoLinks(string) (*os.File, bool, error) { return nil, false, nil }
