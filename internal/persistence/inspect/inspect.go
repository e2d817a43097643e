// Package inspect looks at stored session logs for people: Dump writes a
// session as JSON lines, Verify checks a stored log's invariants without
// changing it. The dsh CLI surfaces both.
package inspect

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

// Dump writes a stored session as JSON lines, exactly as stored and without
// repairing it: the header record ({"type":"session","version":0,"header":
// {...}}) on the first line, then one event per line in canonical JSON
// (session.MarshalEventJSON). This is also the JSONL store's file format.
func Dump(ctx context.Context, r persistence.Reader, id string, w io.Writer) error {
	h, err := r.ReadHeader(ctx, id)
	if err != nil {
		return err
	}
	events, err := r.ReadEvents(ctx, id, 0)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	rec, err := persistence.EncodeHeaderRecord(h)
	if err != nil {
		return fmt.Errorf("session %q: header: %w", id, err)
	}
	bw.Write(rec)
	bw.WriteByte('\n')
	for _, ev := range events {
		b, err := session.MarshalEventJSON(ev)
		if err != nil {
			return fmt.Errorf("session %q: event %d: %w", id, ev.GetSeq(), err)
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// Report describes one stored session.
type Report struct {
	SessionID string
	Header    *sessionv1.SessionHeader
	// Events is the stored log length (a torn tail excluded).
	Events int64
	// Published is the published cursor, -1 when the store keeps none.
	Published int64
	// OpenTurn is the turn left open (0 when the log is balanced); the next
	// Load closes it with Closers synthetic events.
	OpenTurn int32
	Closers  int
	// Problems lists every invariant the stored log breaks, in words; an
	// empty list means the log is valid.
	Problems []string
}

// OK reports whether the stored log broke no invariant.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// StorageChecker is implemented by backends that can check their own
// storage-specific redundancy (for example that two encodings of an event
// agree); Verify calls it when present.
type StorageChecker interface {
	CheckStorage(ctx context.Context, id string) error
}

// Verify checks a stored session without changing it: contiguous seqs, every
// event's canonical JSON round trip, the kernel's log invariants
// (session.CheckLog), the published cursor within the log, and the backend's
// own checks. Problems go into the report; the error is for a session that
// cannot be read at all (not found, unknown version, corrupt beyond reading
// — except on a StorageChecker backend, whose findings about a log it
// cannot read are the report's problems).
func Verify(ctx context.Context, r persistence.Reader, id string) (*Report, error) {
	h, err := r.ReadHeader(ctx, id)
	if err != nil {
		return nil, err
	}
	rep := &Report{SessionID: id, Header: h, Published: -1}
	add := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }
	events, err := r.ReadEvents(ctx, id, 0)
	var corrupt *persistence.CorruptError
	if sc, ok := r.(StorageChecker); ok && errors.As(err, &corrupt) {
		// Unreadable storage the backend can describe: report what it finds
		// (the read error only when the storage check finds nothing more).
		if cerr := sc.CheckStorage(ctx, id); cerr != nil {
			add("storage: %v", cerr)
		} else {
			add("%v", err)
		}
		return rep, nil
	}
	if err != nil {
		return nil, err
	}
	rep.Events = int64(len(events))

	for i, ev := range events {
		if ev.GetSeq() != int64(i) {
			add("event %d carries seq %d", i, ev.GetSeq())
			break
		}
		b, err := session.MarshalEventJSON(ev)
		if err != nil {
			add("seq %d (%s): cannot encode: %v", i, session.TypeName(ev), err)
			continue
		}
		back, err := session.UnmarshalEventJSON(b)
		if err != nil || !proto.Equal(ev, back) {
			add("seq %d (%s): JSON round trip changes the event", i, session.TypeName(ev))
		}
		if !bytes.Equal(b, mustJSON(back)) {
			add("seq %d (%s): JSON encoding is not stable", i, session.TypeName(ev))
		}
	}
	if err := session.CheckLog(events); err != nil {
		add("%v", err)
	}
	if closers := session.InterruptedTurnClosers(events); len(closers) > 0 {
		rep.Closers = len(closers)
		rep.OpenTurn = closers[len(closers)-1].GetTurnEnd().GetTurn()
	}
	if c, ok := r.(interface {
		PublishedCursor(context.Context, string) (int64, error)
	}); ok {
		p, err := c.PublishedCursor(ctx, id)
		if err != nil {
			add("published cursor: %v", err)
		} else {
			rep.Published = p
			if p > rep.Events {
				add("published cursor %d is beyond the %d stored events", p, rep.Events)
			}
		}
	}
	if sc, ok := r.(StorageChecker); ok {
		if err := sc.CheckStorage(ctx, id); err != nil {
			add("storage: %v", err)
		}
	}
	return rep, nil
}

func mustJSON(ev *sessionv1.SessionEvent) []byte {
	if ev == nil {
		return nil
	}
	b, _ := session.MarshalEventJSON(ev)
	return b
}

// Lister is a Reader that can list its sessions.
type Lister interface {
	persistence.Reader
	List(ctx context.Context) ([]*sessionv1.SessionHeader, error)
}

// VerifyAll verifies every listed session. A session that cannot be read
// gets a report whose only problem is the read error.
func VerifyAll(ctx context.Context, s Lister) ([]*Report, error) {
	hs, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*Report, 0, len(hs))
	for _, h := range hs {
		rep, err := Verify(ctx, s, h.GetId())
		if err != nil {
			if ctx.Err() != nil {
				return out, errors.Join(ctx.Err(), err)
			}
			rep = &Report{SessionID: h.GetId(), Header: h, Published: -1, Problems: []string{err.Error()}}
		}
		out = append(out, rep)
	}
	return out, nil
}
