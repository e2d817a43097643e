package session

import "fmt"

// CodeInvariant is the stable code of every invariant violation reported by
// this package, whether at append ([AppendError]) or at load ([InvariantError]).
const CodeInvariant = "INVARIANT"

// AppendError reports an event rejected by [Log.Append]: the rule it broke
// and the event's type. The log is unchanged.
type AppendError struct {
	Seq  int64  // the seq the event would have had
	Type string // the event's type name ("" when it had no payload)
	Rule string // the broken rule, in words
}

func (e *AppendError) Error() string {
	return fmt.Sprintf("session: append rejected at seq %d (%s): %s", e.Seq, typeOrNone(e.Type), e.Rule)
}

// Code returns "INVARIANT".
func (e *AppendError) Code() string { return CodeInvariant }

// InvariantError reports the first event of a log (a seed, a loaded log, a
// sequence checked by [CheckLog] or a [Checker]) that breaks an invariant.
type InvariantError struct {
	Seq  int64  // seq of the first bad event (its position in the log, which is the seq it should have)
	Type string // its type name
	Rule string // the broken rule, in words
}

func (e *InvariantError) Error() string {
	return fmt.Sprintf("session: invariant broken at seq %d (%s): %s", e.Seq, typeOrNone(e.Type), e.Rule)
}

// Code returns "INVARIANT".
func (e *InvariantError) Code() string { return CodeInvariant }

func typeOrNone(t string) string {
	if t == "" {
		return "no payload"
	}
	return t
}
