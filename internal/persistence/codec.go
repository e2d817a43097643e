package persistence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// CheckHeader validates a header given to Create.
func CheckHeader(h *sessionv1.SessionHeader) error {
	if h == nil {
		return fmt.Errorf("%w: nil header", ErrInvalidHeader)
	}
	if h.GetId() == "" {
		return fmt.Errorf("%w: empty session id", ErrInvalidHeader)
	}
	if h.GetVersion() != FormatVersion {
		return fmt.Errorf("session %q: header version %d (this build stores version %d): %w", h.GetId(), h.GetVersion(), FormatVersion, ErrUnknownVersion)
	}
	return nil
}

// CheckBatch checks that a batch continues a log whose next seq is next: the
// first seq equals next and the seqs are contiguous. Nil events are refused.
func CheckBatch(id string, next int64, events []*sessionv1.SessionEvent) error {
	for i, ev := range events {
		want := next + int64(i)
		if ev == nil {
			return &InvalidEventError{SessionID: id, Seq: want, Type: "", Err: errors.New("nil event")}
		}
		if ev.GetSeq() != want {
			return &SeqError{SessionID: id, Index: i, Want: want, Got: ev.GetSeq()}
		}
	}
	return nil
}

// EncodeEvent returns the stored form of an event: its canonical one-line
// JSON (session.MarshalEventJSON), after checking it with the kernel's
// per-event rules (session.ValidateEvent: among them, every raw-JSON field
// holds lossless JSON), so that a store never writes an event its Load would
// reject. A failure is an *InvalidEventError naming the type.
func EncodeEvent(id string, ev *sessionv1.SessionEvent) ([]byte, error) {
	typ := session.TypeName(ev)
	if typ == "" {
		return nil, &InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: "(none)", Err: errors.New("event has no payload")}
	}
	if b, ok := appendDeltaChunk(nil, ev); ok {
		return b, nil // no raw-JSON fields in a delta chunk
	}
	if err := session.ValidateEvent(ev); err != nil {
		return nil, &InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
	}
	b, err := session.MarshalEventJSON(ev)
	if err != nil {
		return nil, &InvalidEventError{SessionID: id, Seq: ev.GetSeq(), Type: typ, Err: err}
	}
	return b, nil
}

// EncodeBatch checks a batch against the stored next seq and encodes every
// event (large batches on all CPUs); on error nothing should be written. The
// error, if any, is the one of the lowest failing event.
func EncodeBatch(id string, next int64, events []*sessionv1.SessionEvent) ([][]byte, error) {
	if err := CheckBatch(id, next, events); err != nil {
		return nil, err
	}
	out := make([][]byte, len(events))
	errs := make([]error, len(events))
	Parallel(len(events), 32, func(i int) { out[i], errs[i] = EncodeEvent(id, events[i]) })
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Parallel calls fn(i) for every i in [0, n), spread over the CPUs when n
// is at least 2*grain (the backends use it to encode and decode batches).
func Parallel(n, grain int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), max(n/grain, 1))
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		wg.Go(func() {
			for i := lo; i < min(lo+chunk, n); i++ {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// DecodeEvent parses the stored form of an event.
func DecodeEvent(b []byte) (*sessionv1.SessionEvent, error) {
	return session.UnmarshalEventJSON(b)
}

// MarshalHeader returns the stored JSON form of a header: protojson with
// proto field names, compact, zero fields omitted.
func MarshalHeader(h *sessionv1.SessionHeader) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(h)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// UnmarshalHeader parses the stored JSON form of a header and checks its
// version.
func UnmarshalHeader(id string, b []byte) (*sessionv1.SessionHeader, error) {
	h := &sessionv1.SessionHeader{}
	if err := protojson.Unmarshal(b, h); err != nil {
		return nil, &CorruptError{SessionID: id, Seq: -1, Err: fmt.Errorf("header: %w", err)}
	}
	if h.GetVersion() != FormatVersion {
		return nil, fmt.Errorf("session %q: stored header version %d (this build reads version %d): %w", id, h.GetVersion(), FormatVersion, ErrUnknownVersion)
	}
	if h.GetId() != id {
		return nil, &CorruptError{SessionID: id, Seq: -1, Err: fmt.Errorf("header names session %q", h.GetId())}
	}
	return h, nil
}

// headerRecord is the header line of a JSON-lines session file and dump.
type headerRecord struct {
	Type    string          `json:"type"`
	Version *int            `json:"version"`
	Header  json.RawMessage `json:"header"`
}

// HeaderRecordType is the "type" of a header record; it cannot collide with
// an event line, which has no "type" field.
const HeaderRecordType = "session"

// EncodeHeaderRecord returns the one-line header record that starts a
// JSON-lines session file or dump:
// {"type":"session","version":0,"header":{...protojson...}}.
func EncodeHeaderRecord(h *sessionv1.SessionHeader) ([]byte, error) {
	hb, err := MarshalHeader(h)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `{"type":%q,"version":%d,"header":`, HeaderRecordType, h.GetVersion())
	if err := json.Compact(&buf, hb); err != nil {
		return nil, err
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// DecodeHeaderRecord parses a header record (line 1 of a session file) and
// checks its version and id.
func DecodeHeaderRecord(id string, line []byte) (*sessionv1.SessionHeader, error) {
	var rec headerRecord
	if err := json.Unmarshal(line, &rec); err != nil || rec.Type != HeaderRecordType || rec.Version == nil || len(rec.Header) == 0 {
		if err == nil {
			err = errors.New(`not a {"type":"session"} header record`)
		}
		return nil, &CorruptError{SessionID: id, Line: 1, Seq: -1, Err: fmt.Errorf("header line: %w", err)}
	}
	if *rec.Version != FormatVersion {
		return nil, fmt.Errorf("session %q: format version %d (this build reads version %d): %w", id, *rec.Version, FormatVersion, ErrUnknownVersion)
	}
	h, err := UnmarshalHeader(id, rec.Header)
	var ce *CorruptError
	if errors.As(err, &ce) {
		ce.Line = 1
	}
	return h, err
}

// CheckLoaded validates a loaded log with the kernel's invariants (surface,
// turn enclosure). A violation is a *CorruptError carrying the seq.
func CheckLoaded(id string, events []*sessionv1.SessionEvent) error {
	_, err := ValidateLoaded(id, events)
	return err
}

// ValidateLoaded validates a loaded log like CheckLoaded and returns the
// synthetic closers of an interrupted final turn (nil for a balanced log),
// checked as the continuation of the log by the same session.Checker. The
// log with its closers has then passed session.CheckLog once, which is what
// lets the agent seed a session.Log with session.WithTrustedSeed instead of
// checking it again. Closers that break an invariant (a kernel bug, never
// the stored data) are reported as a plain error.
func ValidateLoaded(id string, events []*sessionv1.SessionEvent) ([]*sessionv1.SessionEvent, error) {
	var c session.Checker
	for i, ev := range events {
		if ev.GetSeq() != int64(i) {
			return nil, &CorruptError{SessionID: id, Seq: int64(i), Err: fmt.Errorf("event %d carries seq %d", i, ev.GetSeq())}
		}
		if err := c.Check(ev); err != nil {
			seq := int64(-1)
			var inv *session.InvariantError
			if errors.As(err, &inv) {
				seq = inv.Seq
			}
			return nil, &CorruptError{SessionID: id, Seq: seq, Err: err}
		}
	}
	closers := session.InterruptedTurnClosers(events)
	for _, ev := range closers {
		if err := c.Check(ev); err != nil {
			return nil, fmt.Errorf("session %q: repair: a closer breaks an invariant: %w", id, err)
		}
	}
	return closers, nil
}

// Closers returns the synthetic events that close an interrupted final turn
// (semantics.md §3.11), with seqs continuing the log, or nil when the log is
// balanced.
func Closers(events []*sessionv1.SessionEvent) []*sessionv1.SessionEvent {
	return session.InterruptedTurnClosers(events)
}

// Row is one stored event as a SQL store reads it: the row's seq column and
// the event's protobuf bytes.
type Row struct {
	Seq int64
	PB  []byte
}

// DecodeRows parses rows that must hold the events from, from+1, … in
// order, spreading the work over the available CPUs. A row whose seq column
// or decoded seq is not the one due at its position, or whose bytes do not
// parse, is a CorruptError naming that seq.
func DecodeRows(id string, from int64, rows []Row) ([]*sessionv1.SessionEvent, error) {
	events := make([]*sessionv1.SessionEvent, len(rows))
	errs := make([]error, len(rows))
	Parallel(len(rows), 512, func(i int) {
		want := from + int64(i)
		ev := &sessionv1.SessionEvent{}
		err := proto.Unmarshal(rows[i].PB, ev)
		if err == nil && (rows[i].Seq != want || ev.GetSeq() != want) {
			err = fmt.Errorf("row seq %d, event seq %d", rows[i].Seq, ev.GetSeq())
		}
		if err != nil {
			errs[i] = &CorruptError{SessionID: id, Seq: want, Err: err}
			return
		}
		events[i] = ev
	})
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return events, nil
}
