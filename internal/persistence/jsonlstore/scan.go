package jsonlstore

import (
	"bytes"
	"errors"
	"fmt"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

func encodeHeaderLine(h *sessionv1.SessionHeader) ([]byte, error) {
	rec, err := persistence.EncodeHeaderRecord(h)
	if err != nil {
		return nil, err
	}
	return append(rec, '\n'), nil
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
	h, err := persistence.DecodeHeaderRecord(id, data[:nl])
	if err != nil {
		return nil, err
	}
	out := &scanned{header: h}

	// Split the complete lines, then decode them in parallel.
	type span struct{ lo, hi int } // line bytes, without the '\n'
	var lines []span
	off := nl + 1
	for off < len(data) {
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			break
		}
		lines = append(lines, span{off, off + end})
		off += end + 1
	}
	decoded := make([]*sessionv1.SessionEvent, len(lines))
	errs := make([]error, len(lines))
	persistence.Parallel(len(lines), 256, func(i int) {
		decoded[i], errs[i] = decodeLine(data[lines[i].lo:lines[i].hi], int64(i))
	})

	for i, ln := range lines {
		if errs[i] != nil {
			// A bad line: a torn tail unless a committed turn/end follows.
			for j := i + 1; j < len(lines); j++ {
				if isTurnEnd(decoded[j], data[lines[j].lo:lines[j].hi]) {
					return nil, &persistence.CorruptError{SessionID: id, Line: i + 2, Seq: int64(i),
						Err: fmt.Errorf("%w (a committed turn/end follows at line %d)", errs[i], j+2)}
				}
			}
			out.torn = true
			out.valid = int64(ln.lo)
			out.events = decoded[:i]
			return out, nil
		}
	}
	out.events = decoded
	out.valid = int64(off)
	out.torn = off < len(data) // a final line without '\n' was never acknowledged
	return out, nil
}

// isTurnEnd reports whether a line holds a turn/end event, whether or not its
// seq was the one due.
func isTurnEnd(ev *sessionv1.SessionEvent, raw []byte) bool {
	if ev != nil {
		return ev.GetTurnEnd() != nil
	}
	ev, err := persistence.DecodeEvent(raw)
	return err == nil && ev.GetTurnEnd() != nil
}

// decodeLine parses one event line and checks its seq.
func decodeLine(raw []byte, want int64) (*sessionv1.SessionEvent, error) {
	if len(raw) == 0 {
		return nil, errors.New("empty line")
	}
	ev, ok := decodeDeltaChunk(raw)
	if !ok {
		var err error
		if ev, err = persistence.DecodeEvent(raw); err != nil {
			return nil, err
		}
	}
	if ev.GetSeq() != want {
		return nil, fmt.Errorf("seq %d where seq %d was due", ev.GetSeq(), want)
	}
	return ev, nil
}
