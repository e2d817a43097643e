// Package persistence defines the durable session-log seam: the Store
// interface every backend implements, its typed errors, the helpers backends
// share (batch checks, the stored event encoding, load validation and crash
// repair), the optional Reader (read a log as stored, without repair) and
// Discarder (forget in-memory session state) interfaces, and Buffer, the
// write-behind buffer the agent flushes.
//
// A session log is an append-only list of SessionEvents with contiguous seqs
// from 0, plus an immutable SessionHeader kept outside the log. Backends live
// in sub-packages (sqlitestore, jsonlstore); persistencetest holds the
// conformance suite every backend runs.
//
// # Ordering
//
// Appends to one session must follow the log's order: a batch's first seq is
// the stored next seq and its seqs are contiguous. A Store is safe for
// concurrent use; operations on one session are serialised, operations on
// different sessions may overlap.
//
// # Delivery
//
// Append returns nil only once the whole batch is durable: fsynced (with
// sqlitestore's opt-in synchronous=NORMAL: written to the WAL, which
// survives a process crash but not a power loss). It either stores the whole
// batch or nothing. An event is durable exactly when
// the Append (or Buffer.Flush) that carried it has returned nil. Load never
// drops a committed event: it drops only a torn tail (a partially written
// final batch that no Append acknowledged) and closes an interrupted final
// turn with synthetic closers, which it writes durably before returning.
package persistence

import (
	"context"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// FormatVersion is the only SessionHeader.Version this build stores and
// loads. Any other is refused with ErrUnknownVersion.
const FormatVersion = 0

// Store is a durable store of session logs.
type Store interface {
	// Create registers a new session. It may write nothing until the first
	// non-empty Append (lazy materialisation). A duplicate id, stored or
	// pending, fails with ErrExists; a version other than FormatVersion with
	// ErrUnknownVersion.
	Create(ctx context.Context, h *sessionv1.SessionHeader) error

	// Append durably stores one batch. The first event's seq must equal the
	// stored next seq and the batch must be contiguous (*SeqError); every
	// payload must encode to lossless JSON (*InvalidEventError naming the
	// event type). An empty batch is a no-op. On any error nothing of the
	// batch is stored. The store does not retain the events.
	Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error

	// Load returns the header and the log, events[i].Seq == i. A torn tail is
	// dropped; an interrupted final turn is closed with the synthetic closers
	// of session.InterruptedTurnClosers, which are durably appended first.
	// The returned log, closers included, has passed the kernel's full check
	// (ValidateLoaded) and is the caller's: it may seed a session.Log with
	// session.WithTrustedSeed. Errors: ErrNotFound (never appended),
	// ErrUnknownVersion, *CorruptError.
	Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error)

	// List returns the headers of every stored session (those with at least
	// one appended event), ordered by creation time then id. It does not
	// parse whole logs.
	List(ctx context.Context) ([]*sessionv1.SessionHeader, error)

	// PublishedCursor returns the next seq not yet published to the event
	// bus (0 when nothing was). ErrNotFound for a session never appended.
	PublishedCursor(ctx context.Context, id string) (int64, error)

	// SetPublishedCursor records that every event below next was published.
	// The cursor is monotonic: a value at or below the stored one is a no-op.
	// A value beyond the durable log fails with *CursorError.
	SetPublishedCursor(ctx context.Context, id string, next int64) error

	// Close releases the store. Pending (created, never appended) sessions
	// are forgotten.
	Close() error
}

// Reader is implemented by stores that can read a stored log exactly as it
// is, without repairing it or dropping a torn tail from storage: inspection
// tools and the event fan-out's catch-up use it. Both backends implement it.
type Reader interface {
	// ReadHeader returns a stored session's header (ErrNotFound when the
	// session was never appended).
	ReadHeader(ctx context.Context, id string) (*sessionv1.SessionHeader, error)
	// ReadEvents returns the stored events with seq >= from, in order. A
	// torn tail is left out (and left in place).
	ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error)
}

// Discarder is implemented by stores that keep per-session state in memory
// (both backends do). Discard releases it: a created but never appended
// session is forgotten and its id is free again; a stored session is not
// touched (a later call re-reads what it needs). The agent calls it when it
// unloads or abandons a session.
type Discarder interface {
	Discard(ctx context.Context, id string) error
}

// ValidatedAppender is implemented by stores that can skip the per-event
// rules (session.ValidateEvent) for events a session.Log committed, which
// applied them on the way in. AppendValidated is Append otherwise (batch
// contiguity, the stored next seq, atomicity and durability are unchanged);
// the agent flushes its logs through it.
type ValidatedAppender interface {
	AppendValidated(ctx context.Context, id string, events []*sessionv1.SessionEvent) error
}

// EncodingAppender is implemented by stores whose stored form of an event
// is its protobuf encoding. AppendEncoded is AppendValidated that also
// returns what it stored: pb[i] is the protobuf encoding of events[i] (a
// valid proto.Marshal of it, so proto.Unmarshal gives the event back). The
// bytes are the caller's to read, never to modify; the store keeps no
// reference to them. The agent hands them to the event fan-out, which then
// publishes each event without encoding it a second time.
type EncodingAppender interface {
	AppendEncoded(ctx context.Context, id string, events []*sessionv1.SessionEvent) (pb [][]byte, err error)
}

// AppendLogged appends events a session.Log committed: through
// AppendEncoded or AppendValidated when s offers them, else through
// Append. It returns the events' protobuf encodings when the store made
// them (EncodingAppender), else nil.
func AppendLogged(ctx context.Context, s Appender, id string, events []*sessionv1.SessionEvent) ([][]byte, error) {
	switch a := s.(type) {
	case EncodingAppender:
		return a.AppendEncoded(ctx, id, events)
	case ValidatedAppender:
		return nil, a.AppendValidated(ctx, id, events)
	}
	return nil, s.Append(ctx, id, events)
}
