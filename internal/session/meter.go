package session

import (
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// The token meter (semantics.md §7.5) is an incremental fold of a [Log]: the
// surface keeps each node's estimated tokens beside its seq and their sum,
// the request header's estimate is taken when a request/header is committed,
// and the latest assistant/message with provider usage is the anchor of the
// usage baseline. Measuring is O(1); measuring with the per-node list is
// O(surface nodes).

// Baselines of a [Measurement].
const (
	BaselineUsage     = "usage"
	BaselineEstimated = "estimated"
)

// The fixed heuristic of EstimateMessage: about four bytes per token, plus
// a structural overhead per message, per block and per envelope field. It
// takes no configuration, so every reading of one log agrees.
const (
	bytesPerToken   = 4
	messageOverhead = 4   // role and message envelope
	blockOverhead   = 3   // block type and framing
	fieldOverhead   = 2   // a tool call's id and name, a result's id
	binaryTokens    = 768 // an image, audio clip or binary document, whatever its size
)

func textTokens(n int) int64 { return int64(n+bytesPerToken-1) / bytesPerToken }

// EstimateMessage returns the fixed heuristic estimate of one provider
// message in tokens.
func EstimateMessage(m *llmv1.Message) int64 {
	if m == nil {
		return 0
	}
	return messageOverhead + estimateBlocks(m.GetContent())
}

func estimateBlocks(bs []*llmv1.ContentBlock) int64 {
	var n int64
	for _, b := range bs {
		n += blockOverhead
		switch v := b.GetBlock().(type) {
		case *llmv1.ContentBlock_Text:
			n += textTokens(len(v.Text.GetText()))
		case *llmv1.ContentBlock_Reasoning:
			n += textTokens(len(v.Reasoning.GetText()))
		case *llmv1.ContentBlock_ToolCall:
			n += fieldOverhead + textTokens(len(v.ToolCall.GetId())+len(v.ToolCall.GetName())+len(v.ToolCall.GetArguments()))
		case *llmv1.ContentBlock_ToolResult:
			n += fieldOverhead + textTokens(len(v.ToolResult.GetToolCallId())) + estimateBlocks(v.ToolResult.GetContent())
		case *llmv1.ContentBlock_Document:
			if t, ok := v.Document.GetContent().(*llmv1.DocumentBlock_Text); ok {
				n += textTokens(len(t.Text) + len(v.Document.GetUri()))
			} else {
				n += binaryTokens
			}
		case *llmv1.ContentBlock_ResourceLink:
			n += textTokens(len(v.ResourceLink.GetUri()) + len(v.ResourceLink.GetName()) + len(v.ResourceLink.GetDescription()))
		case *llmv1.ContentBlock_Image, *llmv1.ContentBlock_Audio:
			n += binaryTokens
		case *llmv1.ContentBlock_Extension:
			n += textTokens(len(v.Extension.GetType()) + len(v.Extension.GetJson()))
		}
	}
	return n
}

// EstimateHeader returns the estimate of the request envelope a header
// gives every request: the system prompt, the tool schemas and the session
// prefix (0 for nil).
func EstimateHeader(h *sessionv1.EpochHeader) int64 {
	if h == nil {
		return 0
	}
	return estimateEnvelope(h.GetSystem(), h.GetTools(), h.GetMessagePrefix())
}

func estimateEnvelope(system string, tools []*llmv1.ToolSchema, msgs []*llmv1.Message) int64 {
	var n int64
	if system != "" {
		n += messageOverhead + textTokens(len(system))
	}
	for _, t := range tools {
		n += blockOverhead + textTokens(len(t.GetName())+len(t.GetDescription())+len(t.GetParameters()))
	}
	for _, m := range msgs {
		n += EstimateMessage(m)
	}
	return n
}

// EstimateRequest returns the estimate of a whole request's input: system
// prompt, tools and messages. The scripted provider uses it to enforce a
// context window, so the meter and the offline model agree.
func EstimateRequest(req *llmv1.GenerateRequest) int64 {
	return estimateEnvelope(req.GetSystem(), req.GetTools(), req.GetMessages())
}

// UsageTotal is the billed size of one call: input + cache read + cache
// write + output (reasoning is part of output, never added again).
func UsageTotal(u *llmv1.TokenUsage) int64 {
	return u.GetInputTokens() + u.GetCacheReadTokens() + u.GetCacheWriteTokens() + u.GetOutputTokens()
}

// NodeTokens is one surface node's estimate.
type NodeTokens struct {
	Seq    int64
	Tokens int64
}

// Measurement is one reading of the token meter (semantics.md §7.5).
type Measurement struct {
	// LogRevision is the number of events consumed (the next unread seq).
	LogRevision int64
	// Baseline is BaselineUsage when the latest call's provider usage is
	// reused, BaselineEstimated when everything is estimated.
	Baseline string
	// BaselineTokens is the usage total of the anchor call (0 when
	// estimated).
	BaselineTokens int64
	// SurfaceDeltaTokens is the estimate of what joined the surface after
	// the anchor call (all of the surface when estimated).
	SurfaceDeltaTokens int64
	// HeaderTokens is the estimate of the latest request header's
	// envelope (system prompt, tools, session prefix).
	HeaderTokens int64
	// SurfaceTokens is the sum of the nodes' estimates.
	SurfaceTokens int64
	// TotalTokens is the request + response pressure: BaselineTokens +
	// SurfaceDeltaTokens with a usage baseline, HeaderTokens +
	// SurfaceTokens otherwise.
	TotalTokens int64
	// SurfaceNodes is the number of surface nodes measured.
	SurfaceNodes int
	// ReplaceGeneration is the surface's replace generation.
	ReplaceGeneration int
	// Nodes lists every node in surface order (only from
	// [Log.MeasureNodes]).
	Nodes []NodeTokens
}

// usageAnchor is the latest assistant/message that carried usage.
type usageAnchor struct {
	set    bool
	usage  int64 // its billed total
	sum    int64 // surface tokens right after it joined
	hdrTok int64 // header estimate at that time
	reqSeq int64 // seq of the request/header in force
	gen    int   // replace generation at that time
}

// noteUsage records an assistant/message's usage as the anchor; l.mu held.
func (l *Log) noteUsage(ev *sessionv1.SessionEvent) {
	am := ev.GetAssistantMessage()
	if am == nil || am.GetUsage() == nil {
		return
	}
	l.anchor = usageAnchor{set: true, usage: UsageTotal(am.GetUsage()), sum: l.surf.sum, hdrTok: l.hdrTok,
		reqSeq: l.reqSeq, gen: l.surf.gen}
}

// Measure returns the token meter's reading of the log without the
// per-node list. O(1).
func (l *Log) Measure() Measurement {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.measureLocked()
}

// MeasureNodes returns the reading with every surface node's estimate, in
// surface order. O(surface nodes).
func (l *Log) MeasureNodes() Measurement {
	l.mu.RLock()
	defer l.mu.RUnlock()
	m := l.measureLocked()
	m.Nodes = make([]NodeTokens, len(l.surf.nodes))
	for i, s := range l.surf.nodes {
		m.Nodes[i] = NodeTokens{Seq: s, Tokens: l.surf.tok[i]}
	}
	return m
}

func (l *Log) measureLocked() Measurement {
	m := Measurement{LogRevision: int64(len(l.events)), HeaderTokens: l.hdrTok, SurfaceTokens: l.surf.sum,
		SurfaceNodes: len(l.surf.nodes), ReplaceGeneration: l.surf.gen}
	a := l.anchor
	// Usage is the baseline only while it describes the very envelope
	// measured now (same header, no replace since) and is not below the
	// heuristic's own reading of that call: otherwise estimate all.
	if a.set && a.gen == l.surf.gen && a.reqSeq == l.reqSeq && a.usage >= a.hdrTok+a.sum {
		m.Baseline, m.BaselineTokens = BaselineUsage, a.usage
		m.SurfaceDeltaTokens = l.surf.sum - a.sum
		m.TotalTokens = max(a.usage+m.SurfaceDeltaTokens, 0)
		return m
	}
	m.Baseline, m.SurfaceDeltaTokens = BaselineEstimated, l.surf.sum
	m.TotalTokens = l.hdrTok + l.surf.sum
	return m
}
