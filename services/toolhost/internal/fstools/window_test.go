package fstools

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// simpleWindow is the obvious, memory-hungry reference for readWindow.
func simpleWindow(content []byte, offset, limit int) (lines []string, total int) {
	if len(content) == 0 {
		return nil, 0
	}
	parts := bytes.Split(content, []byte("\n"))
	if len(parts[len(parts)-1]) == 0 {
		parts = parts[:len(parts)-1]
	}
	total = len(parts)
	for i := offset - 1; i < total && len(lines) < limit; i++ {
		if i >= 0 {
			// readWindow keeps at most ReadMaxLineLength*utf8.UTFMax bytes
			// of a line, cut before any repair.
			body := bytes.TrimSuffix(parts[i], []byte("\r"))
			cut := len(body) > ReadMaxLineLength*utf8.UTFMax
			lines = append(lines, formatLine(body[:min(len(body), ReadMaxLineLength*utf8.UTFMax)], cut))
		}
	}
	return lines, total
}

func FuzzReadWindow(f *testing.F) {
	f.Add([]byte("a\nb\r\nc"), 1, 2)
	f.Add([]byte("\n\n\n"), 2, 5)
	f.Add([]byte(strings.Repeat("x", 70000)+"\nshort\n"), 1, 10)
	f.Add([]byte("caf\xe9\n"), 1, 1)
	f.Add([]byte(""), 1, 1)
	f.Add(bytes.Repeat([]byte{0xff}, ReadMaxLineLength*utf8.UTFMax+1), 1, 1) // cut before its repair
	f.Fuzz(func(t *testing.T, content []byte, offset, limit int) {
		if bytes.IndexByte(content, 0) >= 0 {
			return
		}
		offset = 1 + abs(offset)%50
		limit = 1 + abs(limit)%50
		w, err := readWindow(context.Background(), bytes.NewReader(content), offset, limit)
		if err != nil {
			t.Fatal(err)
		}
		// appendLine's copy of a clean line is what the repairing path gives.
		for _, part := range bytes.Split(content, []byte("\n")) {
			if got, slow := formatLine(part, false), formatLineSlow(string(bytes.TrimSuffix(part, []byte("\r"))), false); got != slow {
				t.Fatalf("formatLine(%q) = %q, the slow path gives %q", part, got, slow)
			}
		}
		want, total := simpleWindow(content, offset, limit)
		if w.total != total {
			t.Fatalf("total %d, want %d", w.total, total)
		}
		if w.version != versionOf(content) {
			t.Fatal("version is not the content hash")
		}
		if !w.capped && !slices.Equal(w.lines(), want) {
			t.Fatalf("lines %q, want %q", w.lines(), want)
		}
		if w.capped && (len(w.ends) == 0 || !slices.Equal(w.lines(), want[:len(w.ends)])) {
			t.Fatalf("capped lines %q are not a prefix of %q", w.lines(), want)
		}
	})
}

func abs(i int) int {
	if i < 0 {
		if i == -i {
			return 0
		}
		return -i
	}
	return i
}

// formatLine is appendLine into a new string.
func formatLine(b []byte, cut bool) string {
	return string(appendLine(nil, b, cut))
}

// lines is the window's lines as strings.
func (w *window) lines() []string {
	out := make([]string, len(w.ends))
	for i := range w.ends {
		out[i] = string(w.line(i))
	}
	return out
}
