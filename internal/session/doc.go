// Package session is the session kernel shared by every dsh service: the
// append-only event log of one session and everything derived from it.
//
// A session is a [Log] of typed SessionEvents with contiguous zero-based
// seqs. The model-visible history is never stored: it is derived from the
// surface (the ordered list of surface events, semantics.md §3.5) by
// [DeriveMessages], and a Log keeps that derivation cached so that deriving
// after one more append costs O(1) amortised. Every conversation request is a
// pure function of the log ([BuildRequest], the request equation of §3.7);
// [CheckRequest] verifies one. [CheckLog] and [Checker] verify the
// turn-enclosure invariant and the call/result trace (§3.8), and
// [InterruptedTurnClosers] produces the synthetic events that close a turn
// left open by a crash (§3.11).
//
// The package is transport-free: it imports only the generated protobuf
// types and the protobuf runtime.
//
// # Ordering
//
// Appends are totally ordered by seq. Observers registered with [Log.Observe]
// see every event committed after they registered, exactly once, in seq
// order, after the event is committed; an observer may append (its event is
// delivered after the current one) and its panics are contained.
//
// # Validation
//
// [Log.Append] rejects, with an [*AppendError] naming the event type and the
// rule, any event that breaks a surface rule, carries surface fields on a
// non-surface event, carries a raw-JSON field that is not valid JSON, or has
// a seq other than the next one; the log is then unchanged. [NewLog] applies
// the same rules plus [CheckLog] to a seed and reports the first bad event as
// an [*InvariantError], unless [WithTrustedSeed] says the seed is a log a
// Store has just loaded, and so checked: every log is checked once on its
// way in. [ValidateEvent] applies the rules that depend on one event alone.
package session
