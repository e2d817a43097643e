package session

import "google.golang.org/protobuf/proto"

// CloneAll returns a deep copy of every message of ms, nil for nil: a
// caller's messages kept past the call are copies the caller cannot change.
func CloneAll[M proto.Message](ms []M) []M {
	if ms == nil {
		return nil
	}
	out := make([]M, len(ms))
	for i, m := range ms {
		out[i] = proto.CloneOf(m)
	}
	return out
}
