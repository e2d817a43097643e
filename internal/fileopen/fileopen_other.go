//go:build !unix

package fileopen

import "os"

// Read is os.Open where the system-call saving does not apply.
func Read(path string) (*os.File, error) { return os.Open(path) }
