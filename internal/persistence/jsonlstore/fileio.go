package jsonlstore

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// joinLines appends each line plus '\n' to dst.
func joinLines(dst []byte, lines [][]byte) []byte {
	if dst == nil {
		dst = make([]byte, 0, lenLines(lines))
	}
	for _, l := range lines {
		dst = append(dst, l...)
		dst = append(dst, '\n')
	}
	return dst
}

func lenLines(lines [][]byte) int {
	n := 0
	for _, l := range lines {
		n += len(l) + 1
	}
	return n
}

// writeAt writes b at offset off of an existing file and fsyncs it.
func writeAt(path string, off int64, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, off)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// truncate cuts a file to size and fsyncs it.
func truncate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir fsyncs a directory so that a new name in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeFileAtomic replaces path with b through a synced temporary file and a
// rename, so a reader sees the old or the new content, never a mix. The
// rename itself is not made durable: a lost rename leaves the old value.
func writeFileAtomic(dir, path string, b []byte) error {
	tmp, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// readHeader reads and validates only the first line of a session file.
func readHeader(id, path string) (*sessionv1.SessionHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(f, 4096).ReadBytes('\n')
	if err != nil {
		return nil, &persistence.CorruptError{SessionID: id, Line: 1, Seq: -1, Err: fmt.Errorf("header line: %w", err)}
	}
	return persistence.DecodeHeaderRecord(id, line[:len(line)-1])
}

// readCursor reads a cursor file; a missing file is cursor 0.
func readCursor(id, path string) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("session %q: published cursor: %w", id, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, &persistence.CorruptError{SessionID: id, Seq: -1, Err: fmt.Errorf("published cursor file %s: %q", filepath.Base(path), b)}
	}
	return n, nil
}
