package fstools

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// ReadArgs are the read tool's parameters.
type ReadArgs struct {
	FilePath string `json:"file_path" jsonschema:"required,description=Path of the file to read, absolute or relative to the session's working directory."`
	Offset   int    `json:"offset" jsonschema:"description=1-based line number to start reading from (default 1)."`
	Limit    int    `json:"limit" jsonschema:"description=Maximum number of lines to read (default and maximum 2000)."`
}

// readMeta is the read tool's presentation payload.
type readMeta struct {
	Path       string `json:"path"`
	FirstLine  int    `json:"first_line"`
	LastLine   int    `json:"last_line"`
	TotalLines int    `json:"total_lines"`
}

func (f *FS) readTool() toolsdk.Tool {
	return toolsdk.Define("read",
		"Read a text file. Returns a line-numbered window (\"N: text\") of at most 2000 lines and 50 KB; lines longer than 2000 characters are truncated. Use offset and limit to page through large files. Reading a file is required before writing over it or editing it.",
		f.read,
		toolsdk.AlwaysConcurrencySafe(),
		toolsdk.PresentCall(func(a ReadArgs) *toolsv1.ToolCallView {
			loc := &toolsv1.FileLocation{Path: a.FilePath}
			if a.Offset > 0 {
				line := int32(a.Offset)
				loc.Line = &line
			}
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{
				Title: "Read " + a.FilePath, Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_READ, RawInput: a.FilePath,
				Locations: []*toolsv1.FileLocation{loc},
			}}}
		}),
		toolsdk.PresentResult(func(a ReadArgs, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			var m readMeta
			if r.GetIsError() || !decodeMeta(r, &m) {
				return nil
			}
			title := fmt.Sprintf("Read %s (lines %d-%d of %d)", m.Path, m.FirstLine, m.LastLine, m.TotalLines)
			if m.TotalLines == 0 {
				title = "Read " + m.Path + " (empty)"
			}
			return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: title}}}
		}),
	)
}

func (f *FS) read(ctx context.Context, call *toolsdk.Call, a ReadArgs) (toolsdk.Result, error) {
	var bad []string
	if a.Offset < 0 {
		bad = append(bad, `"offset" must be at least 1`)
	}
	if a.Limit < 0 {
		bad = append(bad, `"limit" must be at least 1`)
	}
	if len(bad) > 0 {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: bad}
	}
	offset, limit := max(a.Offset, 1), a.Limit
	if limit == 0 || limit > ReadLimit {
		limit = ReadLimit
	}
	t, file, err := f.conf.OpenRead(call, a.FilePath)
	if err != nil {
		return toolsdk.Result{}, err
	}
	defer file.Close()
	fi, err := file.Stat()
	switch {
	case err != nil:
		return toolsdk.Result{}, t.IOError("stat", err)
	case fi.IsDir():
		return toolsdk.Result{}, fsError(CodeNotRegularFile, "%s is a directory; use glob to list files", t.Display)
	case !fi.Mode().IsRegular():
		return toolsdk.Result{}, fsError(CodeNotRegularFile, "%s is not a regular file", t.Display)
	}
	w, err := readWindow(ctx, file, offset, limit)
	if err != nil {
		if errors.Is(err, errBinary) {
			return toolsdk.Result{}, fsError(CodeNotText, "cannot read binary file: %s", t.Display)
		}
		if ctx.Err() != nil {
			return toolsdk.Result{}, fsError(CodeAborted, "read of %s aborted", t.Display)
		}
		return toolsdk.Result{}, fsError(CodeIOError, "read %s: %v", t.Display, err)
	}
	if w.total > 0 && offset > w.total {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{fmt.Sprintf(`"offset" %d is past the end of the file (%d lines)`, offset, w.total)}}
	}
	f.observed.Record(call.SessionID, t.Real, w.version)

	// One allocation for the text: sized up front, numbers appended without
	// fmt (a Fprintf per line was 5 % of the toolhost's CPU on reads).
	size := len(t.Display) + 160 + len(w.text) + 12*len(w.ends)
	var b strings.Builder
	b.Grow(size)
	b.WriteString("<path>")
	b.WriteString(t.Display)
	b.WriteString("</path>\n<type>file</type>\n<content>\n")
	var num [20]byte
	for i := range w.ends {
		b.Write(strconv.AppendInt(num[:0], int64(offset+i), 10))
		b.WriteString(": ")
		b.Write(w.line(i))
		b.WriteByte('\n')
	}
	last := offset + len(w.ends) - 1
	switch {
	case w.capped:
		fmt.Fprintf(&b, "\n(Output capped at 50 KB. Showing lines %d-%d. Use offset=%d to continue.)\n", offset, last, last+1)
	case last < w.total:
		fmt.Fprintf(&b, "\n(Showing lines %d-%d of %d. Use offset=%d to continue.)\n", offset, last, w.total, last+1)
	default:
		fmt.Fprintf(&b, "\n(End of file - total %d lines)\n", w.total)
	}
	b.WriteString("</content>")
	res := toolsdk.Text(b.String())
	res.Meta = readMeta{Path: t.Display, FirstLine: offset, LastLine: last, TotalLines: w.total}
	return res, nil
}

var errBinary = errors.New("binary file")

// readers recycles the 64 KiB line readers of readWindow.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// window is the kept lines of a file: line i is text[ends[i-1]:ends[i]]
// (from 0 for the first), its ending stripped and repaired (appendLine).
// The lines stay in the one buffer they were read into: the result's text
// is built from it directly, with no string per line or for the whole.
type window struct {
	text    []byte
	ends    []int
	total   int
	capped  bool
	version Version
}

// line is the window's i-th line.
func (w *window) line(i int) []byte {
	start := 0
	if i > 0 {
		start = w.ends[i-1]
	}
	return w.text[start:w.ends[i]]
}

// readWindow streams r once: it hashes every byte (the version), counts
// lines, and keeps the requested window within the line and byte caps. Lines
// of any length are handled without holding more than
// ReadMaxLineLength*utf8.UTFMax bytes of each (cut before any repair).
func readWindow(ctx context.Context, r io.Reader, offset, limit int) (window, error) {
	var w window
	h := sha256.New()
	br := readers.Get().(*bufio.Reader)
	br.Reset(io.TeeReader(r, h))
	defer func() { br.Reset(nil); readers.Put(br) }()
	head, _ := br.Peek(8000)
	if isBinary(head) {
		return w, errBinary
	}
	bytesOut := 0
	lineNo := 0
	var cur []byte
	// The window's lines are appended to one arena, their ends noted: one
	// allocation for the text instead of one per line, none for strings.
	var arena []byte
	var ends []int
	if offset == 1 { // the window starts at the top: its text and lines are about the head's
		arena = make([]byte, 0, len(head))
		ends = make([]int, 0, min(bytes.Count(head, []byte("\n"))+1, limit))
	}
	truncated, pending := false, false
	inWindow := func() bool { return lineNo+1 >= offset && len(ends) < limit && !w.capped }
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			if inWindow() && !truncated {
				room := ReadMaxLineLength*utf8.UTFMax - len(cur)
				body := bytes.TrimSuffix(bytes.TrimSuffix(chunk, []byte("\n")), []byte("\r"))
				if len(body) > room {
					cur = append(cur, chunk[:room]...)
					truncated = true
				} else {
					cur = append(cur, chunk...)
				}
			}
		}
		endOfLine := len(chunk) > 0 && chunk[len(chunk)-1] == '\n'
		pending = pending || len(chunk) > 0
		if endOfLine || (errors.Is(err, io.EOF) && pending) {
			if inWindow() {
				start := len(arena)
				arena = appendLine(arena, cur, truncated)
				if n := len(arena) - start; bytesOut+n+1 > ReadMaxBytes && len(ends) > 0 {
					arena = arena[:start]
					w.capped = true
				} else {
					ends = append(ends, len(arena))
					bytesOut += n + 1
				}
			}
			lineNo++
			cur, truncated, pending = cur[:0], false, false
			if lineNo%4096 == 0 && ctx.Err() != nil {
				return w, ctx.Err()
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return w, err
		}
	}
	w.total, w.text, w.ends = lineNo, arena, ends
	w.version = Version(hex.EncodeToString(h.Sum(nil)[:16]))
	return w, nil
}

// appendLine appends the line b to dst with its ending stripped, invalid
// UTF-8 repaired and truncated to ReadMaxLineLength characters (cut: the
// reader already dropped the line's tail); a valid line within the
// length cap (nearly every line) is copied without an intermediate string.
func appendLine(dst, b []byte, cut bool) []byte {
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if !cut && utf8.Valid(b) && utf8.RuneCount(b) <= ReadMaxLineLength {
		return append(dst, b...)
	}
	return append(dst, formatLineSlow(string(b), cut)...)
}

// formatLineSlow repairs and truncates a line that needs it.
func formatLineSlow(s string, cut bool) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf8.RuneCountInString(s) > ReadMaxLineLength {
		s, cut = string([]rune(s)[:ReadMaxLineLength]), true
	}
	if cut {
		s += fmt.Sprintf("... (line truncated to %d chars)", ReadMaxLineLength)
	}
	return s
}
