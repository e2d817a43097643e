package session

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

var (
	marshalOpts   = protojson.MarshalOptions{UseProtoNames: true}
	unmarshalOpts = protojson.UnmarshalOptions{DiscardUnknown: false}
)

// MarshalEventJSON encodes an event as canonical protojson on one line:
// proto field names, no insignificant whitespace, unset fields omitted (so
// int64 fields are JSON strings, as protojson specifies). The same event
// always yields the same bytes, within and across builds (protojson's
// randomised spacing is compacted away).
func MarshalEventJSON(ev *sessionv1.SessionEvent) ([]byte, error) {
	b, err := marshalOpts.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("session: marshal event %d: %w", ev.GetSeq(), err)
	}
	var buf bytes.Buffer
	buf.Grow(len(b))
	if err := compactJSON(&buf, b); err != nil {
		return nil, fmt.Errorf("session: compact event %d: %w", ev.GetSeq(), err)
	}
	return buf.Bytes(), nil
}

// UnmarshalEventJSON decodes one event written by [MarshalEventJSON] (or any
// protojson form of it). Unknown fields are rejected. It does not validate the
// event against the log rules; [NewLog] and [CheckLog] do.
func UnmarshalEventJSON(b []byte) (*sessionv1.SessionEvent, error) {
	ev := &sessionv1.SessionEvent{}
	if err := unmarshalOpts.Unmarshal(b, ev); err != nil {
		return nil, fmt.Errorf("session: unmarshal event: %w", err)
	}
	return ev, nil
}

// compactJSON removes insignificant whitespace, making protojson output
// byte-stable.
func compactJSON(buf *bytes.Buffer, b []byte) error { return json.Compact(buf, b) }
