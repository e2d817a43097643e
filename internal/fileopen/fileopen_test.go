//go:build unix

package fileopen_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

// BenchmarkOpenRead is the open, read and close of a 1.5 KB file (the
// load ladder's notes.txt) with os.Open and with Beneath.
func BenchmarkOpenRead(b *testing.B) {
	p := filepath.Join(b.TempDir(), "notes.txt")
	if err := os.WriteFile(p, make([]byte, 1560), 0o644); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	for _, bc := range []struct {
		name string
		open func(string) (*os.File, error)
	}{{"os.Open", os.Open}, {"fileopen.Beneath", func(p string) (*os.File, error) {
		return fileopen.Beneath(filepath.Dir(p), p)
	}}} {
		b.Run("open="+bc.name, func(b *testing.B) {
			for b.Loop() {
				f, err := bc.open(p)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(f, buf[:1560]); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}
