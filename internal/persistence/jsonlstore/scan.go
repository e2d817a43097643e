package jsonlstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// headerLine is line 1 of a session file.
type headerLine struct {
	Type    string          `json:"type"`
	Version *int            `json:"version"`
	Header  json.RawMessage `json:"header"`
}

const headerType = "session"

func encodeHeaderLine(h *sessionv1.SessionHeader) ([]byte, error) {
	hb, err := persistence.MarshalHeader(h)
	if err != nil {
		return nil, err
	}
	line := fmt.Appendf(nil, `{"type":%q,"version":%d,"header":`, headerType, h.GetVersion())
	line = append(line, hb...)
	return append(line, '}', '\n'), nil
}

func decodeHeaderLine(id string, line []byte) (*sessionv1.SessionHeader, error) {
	var hl headerLine
	if err := json.Unmarshal(line, &hl); err != nil || hl.Type != headerType || hl.Version == nil || len(hl.Header) == 0 {
		if err == nil {
			err = errors.New(`not a {"type":"session"} header record`)
		}
		return nil, &persistence.CorruptError{SessionID: id, Line: 1, Seq: -1, Err: fmt.Errorf("header line: %w", err)}
	}
	if *hl.Version != persistence.FormatVersion {
		return nil, fmt.Errorf("session %q: file format version %d (this build reads version %d): %w", id, *hl.Version, persistence.FormatVersion, persistence.ErrUnknownVersion)
	}
	h, err := persistence.UnmarshalHeader(id, hl.Header)
	var ce *persistence.CorruptError
	if errors.As(err, &ce) {
		ce.Line = 1
	}
	return h, err
}

// scanned is a parsed session file.
type scanned struct {
	header *sessionv1.SessionHeader
	events []*sessionv1.SessionEvent
	// valid is the length of the prefix holding the header and events; the
	// bytes after it (if any) are a torn tail to truncate.
	valid int64
	torn  bool
}

// scan parses a session file. Every complete line (ending in '\n') after the
// header must hold the event whose seq is its index. The committed boundary
// is the last line holding a valid turn/end event: a bad line at or before it
// is corruption (*persistence.CorruptError with its 1-based line number);
// the first bad line after it, and everything from it, is a torn tail, as is
// a final line without '\n'.
func scan(id string, data []byte) (*scanned, error) {
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 {
		return nil, &persistence.CorruptError{SessionID: id, Line: 1, Seq: -1, Err: errors.New("no complete header line")}
	}
	h, err := decodeHeaderLine(id, data[:nl])
	if err != nil {
		return nil, err
	}
	out := &scanned{header: h}
	off := nl + 1
	line := 1
	for off < len(data) {
		line++
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			out.torn = true // a final line without '\n' was never acknowledged
			break
		}
		raw := data[off : off+end]
		ev, err := decodeLine(raw, int64(len(out.events)))
		if err != nil {
			// Bad line: a torn tail unless a committed turn/end follows.
			if l := committedAfter(data[off+end+1:]); l > 0 {
				return nil, &persistence.CorruptError{SessionID: id, Line: line, Seq: int64(len(out.events)), Err: fmt.Errorf("%w (a committed turn/end follows at line %d)", err, line+l)}
			}
			out.torn = true
			break
		}
		out.events = append(out.events, ev)
		off += end + 1
	}
	out.valid = int64(off)
	return out, nil
}

// decodeLine parses one event line and checks its seq.
func decodeLine(raw []byte, want int64) (*sessionv1.SessionEvent, error) {
	if len(raw) == 0 {
		return nil, errors.New("empty line")
	}
	ev, err := persistence.DecodeEvent(raw)
	if err != nil {
		return nil, err
	}
	if ev.GetSeq() != want {
		return nil, fmt.Errorf("seq %d where seq %d was due", ev.GetSeq(), want)
	}
	return ev, nil
}

// committedAfter reports the 1-based offset (in lines, from the line after
// the bad one) of a complete line holding a turn/end event in rest, or 0.
func committedAfter(rest []byte) int {
	n := 0
	for len(rest) > 0 {
		end := bytes.IndexByte(rest, '\n')
		if end < 0 {
			return 0
		}
		n++
		if ev, err := persistence.DecodeEvent(rest[:end]); err == nil && ev.GetTurnEnd() != nil {
			return n
		}
		rest = rest[end+1:]
	}
	return 0
}
