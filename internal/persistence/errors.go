package persistence

import (
	"errors"
	"fmt"
)

// Stable error codes. A service maps them to gRPC status codes in its own
// errors.go table.
const (
	CodeNotFound       = "SESSION_NOT_FOUND"
	CodeExists         = "SESSION_ALREADY_EXISTS"
	CodeSeq            = "SEQ_MISMATCH"
	CodeUnknownVersion = "UNKNOWN_FORMAT_VERSION"
	CodeCorrupt        = "SESSION_CORRUPT"
	CodeInvalidEvent   = "INVALID_EVENT"
	CodeInvalidHeader  = "INVALID_SESSION_HEADER"
	CodeCursor         = "CURSOR_AHEAD_OF_LOG"
	CodeClosed         = "STORE_CLOSED"
	CodeFenced         = "SESSION_OWNERSHIP_LOST"
)

// codeError is a sentinel with a stable code. Callers match it with
// errors.Is; backends wrap it with the session id.
type codeError struct {
	code string
	msg  string
}

func (e *codeError) Error() string { return e.msg }

// Code returns the stable error code.
func (e *codeError) Code() string { return e.code }

var (
	// ErrNotFound: no stored session has this id.
	ErrNotFound error = &codeError{CodeNotFound, "session not found"}
	// ErrExists: a session with this id was already created (stored or
	// pending in this store).
	ErrExists error = &codeError{CodeExists, "session already exists"}
	// ErrUnknownVersion: the stored data (a session header or a database
	// schema) carries a format version this build does not know. It is
	// refused, never migrated silently.
	ErrUnknownVersion error = &codeError{CodeUnknownVersion, "unknown session format version"}
	// ErrInvalidHeader: a header given to Create is unusable (nil, empty or
	// unencodable id).
	ErrInvalidHeader error = &codeError{CodeInvalidHeader, "invalid session header"}
	// ErrClosed: the store was closed.
	ErrClosed error = &codeError{CodeClosed, "store closed"}
	// ErrFenced: a store shared by several replicas refused a write because
	// this replica does not hold the session's lease at the epoch it
	// acquired (another replica claimed it since). Nothing was written; the
	// caller must drop the session and stop its turn.
	ErrFenced error = &codeError{CodeFenced, "session is owned by another replica"}
)

// SeqError reports an append batch whose seqs do not continue the stored log:
// the first seq is not the stored next seq, or the batch has a gap inside.
// Nothing of the batch was written.
type SeqError struct {
	SessionID string
	// Index is the position in the batch of the offending event.
	Index int
	// Want is the seq that event had to carry; Got is the seq it carried.
	Want, Got int64
}

func (e *SeqError) Error() string {
	if e.Index == 0 {
		return fmt.Sprintf("session %q: batch starts at seq %d, but the stored log continues at seq %d", e.SessionID, e.Got, e.Want)
	}
	return fmt.Sprintf("session %q: batch event %d has seq %d, want %d (seqs must be contiguous)", e.SessionID, e.Index, e.Got, e.Want)
}

// Code returns CodeSeq.
func (e *SeqError) Code() string { return CodeSeq }

// InvalidEventError reports an event that cannot be stored, typically a
// payload field that must hold lossless JSON and does not. Nothing of the
// batch was written.
type InvalidEventError struct {
	SessionID string
	Seq       int64
	// Type is the event's type name, e.g. "tool/call".
	Type string
	Err  error
}

func (e *InvalidEventError) Error() string {
	return fmt.Sprintf("session %q: event %d (%s) cannot be stored: %v", e.SessionID, e.Seq, e.Type, e.Err)
}

// Code returns CodeInvalidEvent.
func (e *InvalidEventError) Code() string { return CodeInvalidEvent }

func (e *InvalidEventError) Unwrap() error { return e.Err }

// CorruptError reports stored data that cannot be loaded without losing
// committed events: a parse failure, a seq gap or an invariant violation at or
// before the last committed turn/end. Line is the 1-based line of a file
// backend (0 when not applicable); Seq is the event's seq (-1 when unknown).
type CorruptError struct {
	SessionID string
	Line      int
	Seq       int64
	Err       error
}

func (e *CorruptError) Error() string {
	switch {
	case e.Line > 0 && e.Seq >= 0:
		return fmt.Sprintf("session %q is corrupt at line %d (seq %d): %v", e.SessionID, e.Line, e.Seq, e.Err)
	case e.Line > 0:
		return fmt.Sprintf("session %q is corrupt at line %d: %v", e.SessionID, e.Line, e.Err)
	case e.Seq >= 0:
		return fmt.Sprintf("session %q is corrupt at seq %d: %v", e.SessionID, e.Seq, e.Err)
	}
	return fmt.Sprintf("session %q is corrupt: %v", e.SessionID, e.Err)
}

// Code returns CodeCorrupt.
func (e *CorruptError) Code() string { return CodeCorrupt }

func (e *CorruptError) Unwrap() error { return e.Err }

// CursorError reports a published cursor set beyond the durable log: only
// durable events may be published, or a crash could publish an event the
// resumed log later reuses the seq of.
type CursorError struct {
	SessionID string
	Next      int64 // the requested cursor
	Len       int64 // the stored log length
}

func (e *CursorError) Error() string {
	return fmt.Sprintf("session %q: published cursor %d is beyond the %d durable events", e.SessionID, e.Next, e.Len)
}

// Code returns CodeCursor.
func (e *CursorError) Code() string { return CodeCursor }

// Code returns the stable code of the first error in err's chain that has
// one, or "" when none does.
func Code(err error) string {
	var c interface{ Code() string }
	if errors.As(err, &c) {
		return c.Code()
	}
	return ""
}
