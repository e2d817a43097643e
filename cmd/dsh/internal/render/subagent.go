package render

import (
	"fmt"
	"strings"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// subagent renders the subagent card: a header line when a child starts
// (description, provider, child session, background task) and a status line
// when it ends (outcome, tokens, error). The child's answer itself is the
// delegating call's result card.
func (r *Renderer) subagent(ev *sessionv1.SessionEvent) {
	r.endLine()
	if s := ev.GetSubagentStart(); s != nil {
		mode := strings.ToLower(strings.TrimPrefix(s.GetMode().String(), "SUBAGENT_MODE_"))
		line := r.style(sCyan, "⧉ ") + r.style(sBold, s.GetDescription()) + r.style(sDim, fmt.Sprintf(" (%s · session %s", mode, s.GetChildSession()))
		if s.GetBackground() {
			line += r.style(sDim, " · background task "+s.GetTaskId())
		}
		r.line(line + r.style(sDim, ") running…"))
		return
	}
	e := ev.GetSubagentEnd()
	u := e.GetUsage()
	usage := fmt.Sprintf(" · %s in / %s out", commas(u.GetInputTokens()), commas(u.GetOutputTokens()))
	if e.GetOutcome() == "completed" {
		r.line(r.style(sCyan, "⧉ ") + r.style(sGreen, "✓ subagent "+e.GetChildSession()+" completed") + r.style(sDim, usage))
		return
	}
	msg := "✗ subagent " + e.GetChildSession() + " " + e.GetOutcome()
	if e.GetError() != "" {
		msg += ": " + OneLine(e.GetError(), 100)
	}
	r.line(r.style(sCyan, "⧉ ") + r.style(sRed, msg) + r.style(sDim, usage))
}
