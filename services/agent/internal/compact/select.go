package compact

import (
	"fmt"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// region is a selected span of the surface: positions [from, to) of the
// surface at replace generation gen.
type region struct {
	from, to int
	seqs     []int64 // the shadowed nodes, in surface order
	tokens   int64   // their estimate
	gen      int
}

// units describes a surface for selection: per position, whether a cut
// before it is balanced (no assistant tool call is unanswered across it),
// and the position just past the last assistant/message (everything after
// it is input the model has not seen yet).
type units struct {
	nodes    []int64
	tokens   []int64
	balanced []bool // balanced[k]: a cut between nodes[k-1] and nodes[k]; len(nodes)+1 entries
	seen     int    // cuts at or before this position keep unseen input out
	gen      int
}

func surfaceUnits(log *session.Log) units {
	m := log.MeasureNodes()
	events := log.Events()
	u := units{balanced: make([]bool, len(m.Nodes)+1), gen: m.ReplaceGeneration}
	pending := map[string]bool{}
	u.balanced[0] = true
	for k, n := range m.Nodes {
		u.nodes = append(u.nodes, n.Seq)
		u.tokens = append(u.tokens, n.Tokens)
		ev := events[n.Seq]
		switch p := ev.GetPayload().(type) {
		case *sessionv1.SessionEvent_AssistantMessage:
			for _, b := range p.AssistantMessage.GetContent() {
				if tc := b.GetToolCall(); tc != nil {
					pending[tc.GetId()] = true
				}
			}
			u.seen = k + 1
		case *sessionv1.SessionEvent_ToolResult:
			delete(pending, p.ToolResult.GetCallId())
		}
		u.balanced[k+1] = len(pending) == 0
	}
	return u
}

func (u units) sum(from, to int) int64 {
	var n int64
	for _, t := range u.tokens[from:to] {
		n += t
	}
	return n
}

func (u units) region(from, to int) region {
	return region{from: from, to: to, seqs: append([]int64(nil), u.nodes[from:to]...), tokens: u.sum(from, to), gen: u.gen}
}

// selectOldest picks the oldest whole units: the region [0, k) for the
// largest balanced cut k that keeps at least retain tokens in the tail,
// keeps every unseen input out, and whose tokens fit budget (≤ 0: no
// bound). ok is false when no such region holds a node.
func (u units) selectOldest(retain, budget int64) (region, bool) {
	var prefix int64
	best := 0
	total := u.sum(0, len(u.nodes))
	for k := 1; k <= u.seen; k++ {
		prefix += u.tokens[k-1]
		if budget > 0 && prefix > budget {
			break
		}
		if u.balanced[k] && total-prefix >= retain {
			best = k
		}
	}
	if best == 0 {
		return region{}, false
	}
	return u.region(0, best), true
}

// SpanError is a manual span that cannot be compacted; its message says
// why in words a person can act on.
type SpanError struct{ Reason string }

func (e *SpanError) Error() string { return "compact: " + e.Reason }

// selectSpan validates an explicit inclusive span of surface seqs.
func (u units) selectSpan(start, end int64) (region, error) {
	i, j := -1, -1
	for k, s := range u.nodes {
		if s == start {
			i = k
		}
		if s == end {
			j = k
		}
	}
	switch {
	case i < 0:
		return region{}, &SpanError{Reason: fmt.Sprintf("start %d is not a node of the current surface (a node is the seq of a user, context, steering or assistant message or a tool result that no later event replaced)", start)}
	case j < 0:
		return region{}, &SpanError{Reason: fmt.Sprintf("end %d is not a node of the current surface", end)}
	case i > j:
		return region{}, &SpanError{Reason: fmt.Sprintf("start %d comes after end %d on the surface (the span is positional and inclusive)", start, end)}
	case j >= u.seen:
		return region{}, &SpanError{Reason: fmt.Sprintf("end %d reaches input the model has not answered yet; end the span at or before seq %d", end, u.lastSeen())}
	case !u.balanced[i]:
		return region{}, &SpanError{Reason: fmt.Sprintf("start %d separates tool results from the assistant message that called them; start at a message boundary", start)}
	case !u.balanced[j+1]:
		return region{}, &SpanError{Reason: fmt.Sprintf("end %d separates an assistant tool call from its results; end after the last result", end)}
	}
	return u.region(i, j+1), nil
}

func (u units) lastSeen() int64 {
	if u.seen == 0 {
		return -1
	}
	return u.nodes[u.seen-1]
}
