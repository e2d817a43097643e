package render

import (
	"sort"
	"strings"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// TailLines is how many lines of a running call's live output its card
// shows.
const TailLines = 3

// maxTailWidth cuts a tail line so it never wraps (a wrapped line would
// break the redraw of the live area).
const maxTailWidth = 100

// liveTail is the last lines of one running call's live output.
type liveTail struct {
	name    string
	lines   []string
	partial string
}

// Progress takes a running call's live output (StreamEvents progress; it
// is not in the log, so a replay has none). It keeps the call's last
// TailLines lines for the running card's live tail (LiveTail); with
// Options.PrintProgress it also prints each complete line under the card,
// for output that cannot be redrawn (not a terminal).
func (r *Renderer) Progress(p *agentv1.ToolProgress) {
	if r.tails == nil {
		r.tails = map[string]*liveTail{}
	}
	if _, running := r.calls[p.GetCallId()]; !running {
		return // its result is shown already, or the call is not ours
	}
	t := r.tails[p.GetCallId()]
	if t == nil {
		t = &liveTail{name: p.GetToolName()}
		r.tails[p.GetCallId()] = t
	}
	text := t.partial + strings.ReplaceAll(p.GetOutput().GetText(), "\r\n", "\n")
	parts := strings.Split(text, "\n")
	t.partial = parts[len(parts)-1]
	for _, l := range parts[:len(parts)-1] {
		l = OneLine(l, maxTailWidth)
		if r.opt.PrintProgress {
			r.line(r.style(sDim, "  ┊ "+l))
		}
		t.lines = append(t.lines, l)
	}
	if len(t.lines) > TailLines {
		t.lines = t.lines[len(t.lines)-TailLines:]
	}
}

// LiveTail is the live area of the running calls: for each call with
// output, its last lines (a partial last line included), as card lines
// ("  ┊ ..."), styled. Empty when nothing runs or nothing was printed.
func (r *Renderer) LiveTail() []string {
	ids := make([]string, 0, len(r.tails))
	for id := range r.tails {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []string
	for _, id := range ids {
		t := r.tails[id]
		lines := append([]string(nil), t.lines...)
		if t.partial != "" {
			lines = append(lines, OneLine(t.partial, maxTailWidth))
		}
		if len(lines) > TailLines {
			lines = lines[len(lines)-TailLines:]
		}
		for _, l := range lines {
			out = append(out, r.style(sDim, "  ┊ "+t.name+": "+l))
		}
	}
	return out
}
