// Package render turns session events into terminal output for the dsh CLI:
// streamed text as it arrives, reasoning dimmed, tool calls as cards built
// from their presentation views (terminal cards with exit status, coloured
// diffs, generic cards), and token usage with cache hits after each turn.
// It works from proto events alone, so a replayed log renders exactly like a
// live one.
//
// A Renderer is not safe for concurrent use; the caller serialises Event
// calls with anything else it writes to the terminal (a spinner).
package render

import (
	"fmt"
	"io"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// Options configure a Renderer.
type Options struct {
	// Color enables ANSI styling (only on a TTY, never with NO_COLOR).
	Color bool
	// ShowUser echoes user prompts (a replay); a chat, where the user just
	// typed the prompt, leaves it off.
	ShowUser bool
	// MaxOutputLines caps the lines of a tool card's body; 0 means 12.
	MaxOutputLines int
	// Reasoning says how reasoning shows: ReasoningFull (dimmed, streamed;
	// the default), ReasoningCollapsed (one dimmed line per block giving its
	// length) or ReasoningHidden.
	Reasoning ReasoningMode
	// PrintProgress prints running calls' live output lines as they come
	// (Progress); off, the output only feeds LiveTail, which a terminal
	// redraws under the spinner.
	PrintProgress bool
}

// ReasoningMode is how reasoning blocks are shown.
type ReasoningMode int

// Reasoning modes.
const (
	ReasoningFull ReasoningMode = iota
	ReasoningCollapsed
	ReasoningHidden
)

// ParseReasoningMode reads "full", "collapsed" or "hidden".
func ParseReasoningMode(s string) (ReasoningMode, bool) {
	switch s {
	case "full", "":
		return ReasoningFull, true
	case "collapsed":
		return ReasoningCollapsed, true
	case "hidden":
		return ReasoningHidden, true
	}
	return 0, false
}

type mode int

const (
	modeNone mode = iota
	modeText
	modeReasoning
)

type stepKey struct{ turn, step int32 }

// Renderer renders events to a writer.
type Renderer struct {
	w    io.Writer
	opt  Options
	mode mode
	// col0 is true when the cursor is at the start of a line.
	col0     bool
	streamed map[stepKey]bool
	calls    map[string]*sessionv1.ToolCall
	running  []string
	usage    turnUsage
	// reasoningWords counts a collapsed reasoning block not yet summarised.
	reasoningWords int
	// tails are the running calls' live output (progress.go).
	tails map[string]*liveTail
}

// SetReasoning changes how later reasoning shows (a chat toggles it).
func (r *Renderer) SetReasoning(m ReasoningMode) { r.opt.Reasoning = m }

// Options are the renderer's options.
func (r *Renderer) Options() Options { return r.opt }

// Reasoning is the current reasoning mode.
func (r *Renderer) Reasoning() ReasoningMode { return r.opt.Reasoning }

type turnUsage struct {
	seen                        bool
	in, out, cacheRead, cacheW  int64
	hasCacheRead, hasCacheWrite bool
	steps                       int
}

// New returns a Renderer writing to w.
func New(w io.Writer, opt Options) *Renderer {
	if opt.MaxOutputLines <= 0 {
		opt.MaxOutputLines = 12
	}
	return &Renderer{w: w, opt: opt, col0: true, streamed: map[stepKey]bool{}, calls: map[string]*sessionv1.ToolCall{}}
}

// Running lists the names of tool calls started and not yet finished, for a
// spinner.
func (r *Renderer) Running() []string { return append([]string(nil), r.running...) }

// AtLineStart reports whether the last output ended a line.
func (r *Renderer) AtLineStart() bool { return r.col0 }

// ANSI styles.
const (
	sReset  = "\x1b[0m"
	sBold   = "\x1b[1m"
	sDim    = "\x1b[2m"
	sRed    = "\x1b[31m"
	sGreen  = "\x1b[32m"
	sYellow = "\x1b[33m"
	sCyan   = "\x1b[36m"
)

func (r *Renderer) style(s, text string) string {
	if !r.opt.Color || text == "" || s == "" {
		return text
	}
	return s + text + sReset
}

func (r *Renderer) write(s string) {
	if s == "" {
		return
	}
	_, _ = io.WriteString(r.w, s)
	r.col0 = strings.HasSuffix(s, "\n")
}

// endLine finishes the current line, if any, and leaves streaming mode; a
// collapsed reasoning block is summarised first.
func (r *Renderer) endLine() {
	if !r.col0 {
		r.write("\n")
	}
	r.mode = modeNone
	if n := r.reasoningWords; n > 0 {
		r.reasoningWords = 0
		r.write(r.style(sDim, fmt.Sprintf("✻ reasoned (%d words)", n)) + "\n")
	}
}

// line writes one full line.
func (r *Renderer) line(s string) {
	r.endLine()
	r.write(s + "\n")
}

// Event renders one event.
func (r *Renderer) Event(ev *sessionv1.SessionEvent) {
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_TurnStart:
		r.usage = turnUsage{}
	case *sessionv1.SessionEvent_UserMessage:
		if ev.GetSurfaceOp().GetReplace() != nil {
			return // a compaction checkpoint: the compaction card shows it
		}
		if r.opt.ShowUser {
			r.line(r.style(sBold, "› ") + r.style(sBold, firstLines(blocksText(p.UserMessage.GetContent()), 0)))
		}
	case *sessionv1.SessionEvent_SteeringMessage:
		r.line(r.style(sBold, "› ") + r.style(sDim, "(steering) ") + blocksText(p.SteeringMessage.GetContent()))
	case *sessionv1.SessionEvent_ContextMessage:
		r.line(r.style(sDim, "· context: "+OneLine(blocksText(p.ContextMessage.GetContent()), 100)))
	case *sessionv1.SessionEvent_PromptBlocked:
		r.line(r.style(sRed, "✗ prompt blocked: "+p.PromptBlocked.GetReason()))
	case *sessionv1.SessionEvent_AssistantChunk:
		r.chunks(p.AssistantChunk)
	case *sessionv1.SessionEvent_AssistantMessage:
		r.assistant(p.AssistantMessage)
	case *sessionv1.SessionEvent_ToolCall:
		r.toolCall(p.ToolCall)
	case *sessionv1.SessionEvent_ToolResult:
		if ev.GetSurfaceOp().GetReplace() != nil {
			r.compaction(ev) // a pruned result (compact.go)
			return
		}
		r.toolResult(p.ToolResult)
	case *sessionv1.SessionEvent_TodoWrite:
		r.todos(p.TodoWrite)
	case *sessionv1.SessionEvent_TurnEnd:
		r.turnEnd(p.TurnEnd)
	case *sessionv1.SessionEvent_SessionTitle:
		r.line(r.style(sDim, "· title: "+OneLine(p.SessionTitle.GetTitle(), 200)))
	case *sessionv1.SessionEvent_SubagentStart, *sessionv1.SessionEvent_SubagentEnd:
		r.subagent(ev) // subagent.go
	case *sessionv1.SessionEvent_CompactStart, *sessionv1.SessionEvent_CompactSummary, *sessionv1.SessionEvent_CompactEnd:
		r.compaction(ev) // compact.go
	case *sessionv1.SessionEvent_Extension:
		r.line(r.style(sDim, "· "+session.TypeName(ev)))
	}
}

// chunks renders the chunks an assistant/chunk event holds, in order.
func (r *Renderer) chunks(c *sessionv1.AssistantChunk) {
	for ch := range session.Chunks(c) {
		r.chunk(c, ch)
	}
}

func (r *Renderer) chunk(c *sessionv1.AssistantChunk, ch *llmv1.StreamChunk) {
	switch k := ch.GetChunk().(type) {
	case *llmv1.StreamChunk_TextDelta:
		r.streamed[stepKey{c.GetTurn(), c.GetStep()}] = true
		if r.mode != modeText {
			r.endLine()
			r.mode = modeText
		}
		r.write(k.TextDelta.GetText())
	case *llmv1.StreamChunk_ReasoningDelta:
		r.streamed[stepKey{c.GetTurn(), c.GetStep()}] = true
		switch r.opt.Reasoning {
		case ReasoningHidden:
			return
		case ReasoningCollapsed:
			if r.mode != modeReasoning {
				r.endLine()
				r.mode = modeReasoning
			}
			r.reasoningWords += len(strings.Fields(k.ReasoningDelta.GetText()))
			return
		}
		if r.mode != modeReasoning {
			r.endLine()
			r.mode = modeReasoning
			r.write(r.style(sDim, "✻ "))
		}
		r.write(r.style(sDim, k.ReasoningDelta.GetText()))
	}
}

func (r *Renderer) assistant(m *sessionv1.AssistantMessage) {
	key := stepKey{m.GetTurn(), m.GetStep()}
	if !r.streamed[key] {
		for _, b := range m.GetContent() {
			switch v := b.GetBlock().(type) {
			case *llmv1.ContentBlock_Reasoning:
				switch r.opt.Reasoning {
				case ReasoningFull:
					r.line(r.style(sDim, "✻ "+v.Reasoning.GetText()))
				case ReasoningCollapsed:
					r.endLine()
					r.reasoningWords = len(strings.Fields(v.Reasoning.GetText()))
					r.endLine()
				}
			case *llmv1.ContentBlock_Text:
				r.line(v.Text.GetText())
			}
		}
	}
	delete(r.streamed, key)
	r.endLine()
	if u := m.GetUsage(); u != nil {
		r.usage.seen = true
		r.usage.in += u.GetInputTokens()
		r.usage.out += u.GetOutputTokens()
		if u.CacheReadTokens != nil {
			r.usage.hasCacheRead = true
			r.usage.cacheRead += u.GetCacheReadTokens()
		}
		if u.CacheWriteTokens != nil {
			r.usage.hasCacheWrite = true
			r.usage.cacheW += u.GetCacheWriteTokens()
		}
	}
	r.usage.steps++
}

func (r *Renderer) toolCall(c *sessionv1.ToolCall) {
	r.calls[c.GetCallId()] = c
	r.running = append(r.running, c.GetName())
	r.endLine()
	bullet := r.style(sCyan, "⏺ ")
	switch v := c.GetView().GetCard().(type) {
	case *toolsv1.ToolCallView_Terminal:
		t := v.Terminal
		cmd := t.GetTitle()
		if cmd == "" {
			cmd = t.GetDescription()
		}
		head := bullet + r.style(sBold, "$ "+OneLine(cmd, 200))
		if t.GetDescription() != "" && t.GetDescription() != cmd {
			head += r.style(sDim, "  # "+OneLine(t.GetDescription(), 80))
		}
		r.line(head)
	case *toolsv1.ToolCallView_Diff:
		r.line(bullet + r.style(sBold, orName(v.Diff.GetTitle(), c.GetName())))
	case *toolsv1.ToolCallView_Generic:
		head := bullet + r.style(sBold, orName(v.Generic.GetTitle(), c.GetName()))
		if len(v.Generic.GetLocations()) > 0 && v.Generic.GetTitle() == "" {
			head += " " + v.Generic.GetLocations()[0].GetPath()
		}
		r.line(head)
	default:
		r.line(bullet + r.style(sBold, c.GetName()) + r.style(sDim, " "+OneLine(c.GetArguments(), 120)))
	}
}

func orName(title, name string) string {
	if title != "" {
		return title
	}
	return name
}

func (r *Renderer) toolResult(res *sessionv1.ToolResult) {
	for i, n := range r.running {
		if c := r.calls[res.GetCallId()]; c != nil && n == c.GetName() {
			r.running = append(r.running[:i], r.running[i+1:]...)
			break
		}
	}
	delete(r.calls, res.GetCallId())
	delete(r.tails, res.GetCallId())
	r.endLine()
	switch v := res.GetView().GetCard().(type) {
	case *toolsv1.ToolResultView_Terminal:
		t := v.Terminal
		r.body(trimExitNote(t.GetOutput()), "")
		switch {
		case t.GetSignal() != "":
			r.line(r.style(sDim, "  ╰ ") + r.style(sRed, "killed by "+t.GetSignal()))
		case t.ExitCode != nil && t.GetExitCode() == 0:
			r.line(r.style(sDim, "  ╰ ") + r.style(sGreen, "exit 0"))
		case t.ExitCode != nil:
			r.line(r.style(sDim, "  ╰ ") + r.style(sRed, fmt.Sprintf("exit %d", t.GetExitCode())))
		case res.GetIsError():
			r.line(r.style(sDim, "  ╰ ") + r.style(sRed, "failed"))
		}
	case *toolsv1.ToolResultView_Diff:
		for _, d := range v.Diff.GetDiffs() {
			r.diff(d)
		}
		if res.GetIsError() {
			r.errorBody(res)
		}
	case *toolsv1.ToolResultView_Generic:
		text := blocksText(v.Generic.GetContent())
		if text == "" {
			text = blocksText(res.GetContent())
		}
		if res.GetIsError() {
			r.body(text, sRed)
		} else {
			r.body(text, sDim)
		}
	default:
		if res.GetIsError() {
			r.errorBody(res)
		} else {
			r.body(blocksText(res.GetContent()), sDim)
		}
	}
}

func (r *Renderer) errorBody(res *sessionv1.ToolResult) {
	text := blocksText(res.GetContent())
	if code := res.GetError().GetCode(); code != "" && !strings.Contains(text, code) {
		text = code + ": " + text
	}
	r.body(text, sRed)
}

// body writes text as a card body: "  │ " prefixed lines, capped.
func (r *Renderer) body(text, style string) {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		return
	}
	lines := strings.Split(text, "\n")
	max := r.opt.MaxOutputLines
	more := 0
	if len(lines) > max {
		more = len(lines) - max
		lines = lines[:max]
	}
	for _, l := range lines {
		r.line(r.style(sDim, "  │ ") + r.style(style, strings.TrimRight(l, "\r")))
	}
	if more > 0 {
		r.line(r.style(sDim, fmt.Sprintf("  │ … %d more lines", more)))
	}
}

func (r *Renderer) diff(d *toolsv1.FileDiff) {
	r.line(r.style(sDim, "  │ ") + r.style(sBold, d.GetPath()))
	ops := lineDiff(d.GetOldText(), d.GetNewText())
	shown := 0
	for i, op := range ops {
		if shown >= r.opt.MaxOutputLines*2 {
			r.line(r.style(sDim, fmt.Sprintf("  │ … %d more diff lines", len(ops)-i)))
			break
		}
		switch op.kind {
		case '+':
			r.line(r.style(sDim, "  │ ") + r.style(sGreen, "+ "+op.text))
		case '-':
			r.line(r.style(sDim, "  │ ") + r.style(sRed, "- "+op.text))
		default:
			continue // context lines are left out to keep cards short
		}
		shown++
	}
}

func (r *Renderer) todos(t *sessionv1.TodoWrite) {
	r.line(r.style(sCyan, "⏺ ") + r.style(sBold, "Todos"))
	for _, it := range t.GetTodos() {
		mark, style := "☐", ""
		switch it.GetStatus() {
		case sessionv1.TodoStatus_TODO_STATUS_COMPLETED:
			mark, style = "☒", sDim
		case sessionv1.TodoStatus_TODO_STATUS_IN_PROGRESS:
			mark, style = "▶", sYellow
		}
		r.line(r.style(sDim, "  │ ") + r.style(style, mark+" "+it.GetContent()))
	}
}

func (r *Renderer) turnEnd(e *sessionv1.TurnEnd) {
	r.endLine()
	r.running = nil
	clear(r.calls)
	clear(r.tails)
	reason := e.GetReason()
	switch k := reason.GetKind().(type) {
	case *sessionv1.TurnEndReason_Completed, nil:
	case *sessionv1.TurnEndReason_Error:
		msg := k.Error.GetFailure().GetMessage()
		if msg == "" {
			msg = k.Error.GetMessage()
		}
		code := k.Error.GetFailure().GetCode()
		if code == "" {
			code = k.Error.GetCode()
		}
		if code != "" {
			msg = code + ": " + msg
		}
		r.line(r.style(sRed, "✗ turn failed: "+OneLine(msg, 300)))
	case *sessionv1.TurnEndReason_Aborted:
		r.line(r.style(sYellow, "⏹ turn cancelled"))
	case *sessionv1.TurnEndReason_Rejected:
		r.line(r.style(sRed, "✗ prompt rejected: "+k.Rejected.GetReason()))
	default:
		r.line(r.style(sYellow, "⏹ turn ended: "+EndReasonName(reason)))
	}
	if u := r.usage; u.seen {
		s := fmt.Sprintf("tokens: %s in", commas(u.in))
		if u.hasCacheRead {
			pct := 0
			if u.in > 0 {
				pct = int(u.cacheRead * 100 / u.in)
			}
			s += fmt.Sprintf(" (%s cached, %d%%)", commas(u.cacheRead), pct)
		}
		if u.hasCacheWrite && u.cacheW > 0 {
			s += fmt.Sprintf(" (+%s cache write)", commas(u.cacheW))
		}
		s += fmt.Sprintf(" · %s out · %d step", commas(u.out), u.steps)
		if u.steps != 1 {
			s += "s"
		}
		r.line(r.style(sDim, s))
	}
	r.usage = turnUsage{}
}

// trimExitNote drops a trailing "[exit code: N]" line (the model-facing
// note some hosts append); the card shows the exit status itself.
func trimExitNote(out string) string {
	t := strings.TrimRight(out, "\n")
	i := strings.LastIndexByte(t, '\n')
	last := t[i+1:]
	if strings.HasPrefix(last, "[exit code: ") && strings.HasSuffix(last, "]") {
		return t[:max(i, 0)]
	}
	return out
}

// EndReasonName is the stable name of a turn/end reason ("completed", ...).
func EndReasonName(reason *sessionv1.TurnEndReason) string {
	switch k := reason.GetKind().(type) {
	case *sessionv1.TurnEndReason_Completed:
		return "completed"
	case *sessionv1.TurnEndReason_Aborted:
		return "aborted"
	case *sessionv1.TurnEndReason_Error:
		return "error"
	case *sessionv1.TurnEndReason_Disposed:
		return "disposed"
	case *sessionv1.TurnEndReason_MaxTokens:
		return "max-tokens"
	case *sessionv1.TurnEndReason_Rejected:
		return "rejected"
	case *sessionv1.TurnEndReason_Interrupted:
		return "interrupted"
	case *sessionv1.TurnEndReason_Extension:
		return k.Extension.GetType()
	default:
		return "unknown"
	}
}

// blocksText joins the text of text blocks (and nested tool-result text).
func blocksText(bs []*llmv1.ContentBlock) string {
	var parts []string
	for _, b := range bs {
		switch v := b.GetBlock().(type) {
		case *llmv1.ContentBlock_Text:
			parts = append(parts, v.Text.GetText())
		case *llmv1.ContentBlock_ToolResult:
			parts = append(parts, blocksText(v.ToolResult.GetContent()))
		case *llmv1.ContentBlock_Image:
			parts = append(parts, "[image "+v.Image.GetMimeType()+"]")
		}
	}
	return strings.Join(parts, "\n")
}

// AnswerText is the text of an assistant message's text blocks.
func AnswerText(m *sessionv1.AssistantMessage) string {
	var parts []string
	for _, b := range m.GetContent() {
		if t, ok := b.GetBlock().(*llmv1.ContentBlock_Text); ok {
			parts = append(parts, t.Text.GetText())
		}
	}
	return strings.Join(parts, "")
}

// OneLine collapses whitespace and cuts s to max runes (an ellipsis
// included); max 0 keeps it whole.
func OneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if max > 0 && len([]rune(s)) > max {
		s = string([]rune(s)[:max-1]) + "…"
	}
	return s
}

func firstLines(s string, _ int) string { return strings.TrimRight(s, "\n") }

func commas(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
