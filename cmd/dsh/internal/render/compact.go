package render

import (
	"fmt"
	"strings"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// compaction renders the compaction card: a line when a compaction starts
// (why), the summary that replaced the older context (how much, its first
// lines), and a failure when one ends with an error. The checkpoint
// user/message and pruned tool results (surface replaces) are not shown as
// new messages: the card stands for them.
func (r *Renderer) compaction(ev *sessionv1.SessionEvent) {
	r.endLine()
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_CompactStart:
		why := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(p.CompactStart.GetTrigger().String(), "COMPACT_TRIGGER_"), "_", " "))
		r.line(r.style(sCyan, "⟲ ") + r.style(sDim, "compacting the context ("+why+")…"))
	case *sessionv1.SessionEvent_CompactSummary:
		s := p.CompactSummary
		r.line(r.style(sCyan, "⟲ ") + r.style(sBold, fmt.Sprintf("compacted %d messages (%s tokens) into a summary", len(s.GetShadowedSeqs()), commas(s.GetShadowedTokenCount()))))
		if body := headLines(s.GetSummary(), 3); body != "" {
			r.body(body, sDim)
		}
	case *sessionv1.SessionEvent_CompactEnd:
		if e := p.CompactEnd.GetError(); e != "" {
			r.line(r.style(sCyan, "⟲ ") + r.style(sRed, "✗ compaction failed: "+OneLine(e, 160)))
		}
	case *sessionv1.SessionEvent_ToolResult:
		r.line(r.style(sDim, "· pruned the output of "+p.ToolResult.GetCallId()))
	}
}

// headLines keeps the first n lines of s, marking a cut with "…".
func headLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}
