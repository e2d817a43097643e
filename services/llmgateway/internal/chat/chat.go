// Package chat is the chat-completions wire format shared by the deepseek
// and openai adapters: request serialisation, the streaming translation to
// StreamChunks, usage mapping and error classification. A Dialect switches
// the few places where DeepSeek and generic OpenAI-compatible servers differ.
//
// # Ordering
//
// One harness block per provider text, reasoning and tool-call index,
// numbered in the order they open; an empty first delta opens nothing. All
// block-ends, then usage (at most once, the last usage the provider sent),
// then finish are emitted only at the provider's "[DONE]" marker, so a
// trailing usage-only chunk can never follow the finish.
package chat

import (
	"context"
	"encoding/base64"
	"fmt"
	json "github.com/segmentio/encoding/json"
	"iter"
	"log/slog"
	"net/http"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/fragment"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/memo"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
)

// Dialect holds the differences between chat-completions servers.
type Dialect struct {
	// Kind is the adapter kind reported by Kind (deepseek, openai).
	Kind string
	// Images lets user messages carry image parts.
	Images bool
	// ReasoningPassback sends reasoning_content back on assistant turns that
	// have tool calls (DeepSeek thinking mode requires it).
	ReasoningPassback bool
	// CompactionHeader is set to "1" on PURPOSE_COMPACTION calls, if any.
	CompactionHeader string
	// RequestIDHeaders name the response headers carrying the request id.
	RequestIDHeaders []string
	// MaxCompletionTokens sends the output limit as max_completion_tokens
	// (OpenAI's own API, whose reasoning models reject max_tokens) instead
	// of max_tokens (DeepSeek, vLLM, Ollama, llama.cpp).
	MaxCompletionTokens bool
}

// Config configures one adapter instance.
type Config struct {
	// Route labels the provider in messages and logs.
	Route string
	// BaseURL is the API root; requests go to BaseURL + "/chat/completions".
	BaseURL string
	// APIKey is sent as a bearer token when non-empty. Never logged.
	APIKey string
	// Models is the advisory catalogue.
	Models []provider.Model
	// Thinking, when set, is sent as top-level thinking:{type} (DeepSeek:
	// "enabled" or "disabled").
	Thinking string
	// ReasoningEffort, when set, is sent as reasoning_effort.
	ReasoningEffort string
	// NoImages turns the dialect's images off for this route (a text-only
	// model behind an OpenAI-compatible server).
	NoImages bool
	// Client sends the requests (shared transport, User-Agent, idle bound).
	Client upstream.Client
	// Logger receives the dropped-block counts.
	Logger *slog.Logger
}

// Adapter is a chat-completions adapter.
type Adapter struct {
	d      Dialect
	cfg    Config
	url    string
	client upstream.Client
	// params remembers tool schemas encoded as JSON values.
	params *memo.Memo[[]byte]
}

// New returns an adapter speaking dialect d.
func New(d Dialect, cfg Config) *Adapter {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.NoImages {
		d.Images = false
	}
	c := cfg.Client
	c.RequestIDHeaders = d.RequestIDHeaders
	if cfg.APIKey != "" {
		c.Secrets = append(append([]string(nil), c.Secrets...), cfg.APIKey)
	}
	return &Adapter{d: d, cfg: cfg, url: strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions", client: c, params: memo.New(maxSchemas, encodeRaw)}
}

var _ provider.Adapter = (*Adapter)(nil)

// Kind implements provider.Adapter.
func (a *Adapter) Kind() string { return a.d.Kind }

// Models implements provider.Adapter.
func (a *Adapter) Models() []provider.Model { return a.cfg.Models }

// Validate implements provider.Adapter: images only in user messages.
// What the route cannot carry (images on a route without vision, images
// inside tool results, audio, binary documents) is not an error: Body
// degrades it (see provider.Placeholder).
func (a *Adapter) Validate(req *llmv1.GenerateRequest) error {
	for i, m := range req.GetMessages() {
		for j, b := range m.GetContent() {
			if b.GetImage() != nil && m.GetRole() != llmv1.Role_ROLE_USER {
				return &provider.RequestError{Field: fmt.Sprintf("messages[%d].content[%d]", i, j), Reason: "image block: only user messages may carry images"}
			}
		}
	}
	return nil
}

// maxImageBytes bounds one image sent to a chat-completions route (OpenAI's
// limit); a larger one is described instead.
const maxImageBytes = 20 << 20

// imageReason says why img cannot go to this route as an image, or "".
func (a *Adapter) imageReason(img *llmv1.ImageBlock) string {
	if !a.d.Images {
		return fmt.Sprintf("route %q does not take images", a.cfg.Route)
	}
	return provider.ImageReason(img, maxImageBytes)
}

// Stream implements provider.Adapter.
func (a *Adapter) Stream(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	h := http.Header{}
	if a.cfg.APIKey != "" {
		h.Set("Authorization", "Bearer "+a.cfg.APIKey)
	}
	if a.d.CompactionHeader != "" && req.GetPurpose() == llmv1.Purpose_PURPOSE_COMPACTION {
		h.Set(a.d.CompactionHeader, "1")
	}
	return a.client.Stream(ctx, upstream.Call{Route: a.cfg.Route, URL: a.url, Header: h, Logger: a.cfg.Logger,
		Body: func() ([][]byte, int, error) { return a.body(req, provider.BodyCacheFrom(ctx)) }, Translate: translate})
}

// translate folds the provider's events into chunks.
func translate(s *upstream.Stream, e *provider.Emitter) {
	st := translator{text: none, reasoning: none}
	var c streamChunk
	for {
		ev, f := s.Next()
		if f != nil {
			e.Fail(f)
			return
		}
		data := ev.Data
		if string(data) == "[DONE]" {
			s.End()
			break
		}
		if fd, ok := parseFast(data); ok {
			// The common cases: text, or one tool call's fragment, and
			// the finish reason (see fast.go).
			if !st.deltaText(e, s, fd.reasoningText(), fd.content) {
				return
			}
			if fd.tool && !st.toolDelta(e, s, fd.toolIndex, fd.toolID, fd.toolName, fd.args) {
				return
			}
			if fd.finish != "" {
				st.finish = fd.finish
			}
			continue
		}
		c = streamChunk{}
		if err := json.Unmarshal(data, &c); err != nil {
			e.Fail(s.Fail(provider.CodeMalformedResponse, fmt.Sprintf("bad JSON in stream: %v; event: %.200s", err, data)))
			return
		}
		if c.Error != nil {
			kind, msg := c.Error.detail()
			if msg == "" {
				msg = "provider error"
			}
			f := s.Fail(provider.ClassifyDetail(kind, msg), "provider error mid-stream: "+msg)
			e.Fail(f)
			return
		}
		if c.Usage != nil {
			st.usage = c.Usage.proto()
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue // n > 1 is never requested
			}
			d := &ch.Delta
			if !st.deltaText(e, s, d.reasoning(), d.Content) {
				return
			}
			for _, tc := range d.ToolCalls {
				if !st.toolDelta(e, s, tc.Index, tc.ID, tc.Function.Name, tc.Function.Arguments) {
					return
				}
			}
			if ch.FinishReason != "" {
				st.finish = ch.FinishReason
			}
		}
	}
	if !e.EndAll() {
		return
	}
	if st.usage != nil && !e.Usage(st.usage) {
		return
	}
	e.Finish(finishReason(st.finish), nil)
}

const none = -1

// translator is the state of one stream's translation.
type translator struct {
	text, reasoning int
	// tools maps the provider's tool-call indexes to their blocks, in
	// open order (a turn has a few: a slice, not a map per stream), and
	// byIndex too once there are more than manyTools of them.
	tools   []toolBlock
	byIndex map[int]uint32
	usage   *llmv1.TokenUsage
	finish  string
	buf     []byte
}

// toolBlock is the block of the provider's tool call index.
type toolBlock struct {
	index int
	block uint32
}

// manyTools is how many tool calls a stream's translation looks up in its
// slice; past it, in a map (a stream of thousands of calls stays linear).
const manyTools = 16

// tool returns the block of the provider's tool call index, if open.
func (st *translator) tool(index int) (uint32, bool) {
	if st.byIndex != nil {
		b, ok := st.byIndex[index]
		return b, ok
	}
	for i := len(st.tools) - 1; i >= 0; i-- { // the latest is the usual one
		if st.tools[i].index == index {
			return st.tools[i].block, true
		}
	}
	return 0, false
}

func (st *translator) addTool(index int, block uint32) {
	if st.byIndex != nil {
		st.byIndex[index] = block
		return
	}
	st.tools = append(st.tools, toolBlock{index, block})
	if len(st.tools) > manyTools {
		st.byIndex = make(map[int]uint32, 2*len(st.tools))
		for _, t := range st.tools {
			st.byIndex[t.index] = t.block
		}
	}
}

func (st *translator) frag(raw json.RawMessage) ([]byte, error) {
	var err error
	st.buf, err = fragment.Unquote(st.buf[:0], raw)
	return st.buf, err
}

// toolDelta streams one tool call's fragment (args a raw JSON string),
// opening its block on the first delta of its index.
func (st *translator) toolDelta(e *provider.Emitter, s *upstream.Stream, index int, id, name string, rawArgs []byte) bool {
	i, ok := st.tool(index)
	if !ok {
		if id == "" {
			id = fmt.Sprintf("call-%d", e.Len())
		}
		i, _ = e.OpenToolCall(id, "")
		st.addTool(index, i)
	}
	args, err := st.frag(rawArgs)
	if err != nil {
		e.Fail(s.Fail(provider.CodeMalformedResponse, "bad tool arguments string in stream"))
		return false
	}
	return e.Fragment(i, name, args)
}

// deltaText streams a delta's reasoning and content (raw JSON strings), opening
// their blocks on first non-empty text.
func (st *translator) deltaText(e *provider.Emitter, s *upstream.Stream, reasoning, content json.RawMessage) bool {
	r, err := st.frag(reasoning)
	if err != nil {
		e.Fail(s.Fail(provider.CodeMalformedResponse, "bad reasoning string in stream"))
		return false
	}
	if len(r) > 0 {
		if st.reasoning == none {
			i, _ := e.Open(llmv1.BlockType_BLOCK_TYPE_REASONING)
			st.reasoning = int(i)
		}
		if !e.Fragment(uint32(st.reasoning), "", r) {
			return false
		}
	}
	t, err := st.frag(content)
	if err != nil {
		e.Fail(s.Fail(provider.CodeMalformedResponse, "bad content string in stream"))
		return false
	}
	if len(t) > 0 {
		if st.text == none {
			i, _ := e.Open(llmv1.BlockType_BLOCK_TYPE_TEXT)
			st.text = int(i)
		}
		if !e.Fragment(uint32(st.text), "", t) {
			return false
		}
	}
	return true
}

func finishReason(r string) *llmv1.FinishReason {
	switch r {
	case "stop", "":
		return provider.Stop()
	case "tool_calls":
		return provider.ToolCalls()
	case "length":
		return provider.MaxTokens()
	}
	return provider.StoppedFor(r)
}

type streamChunk struct {
	Choices []struct {
		Index        int    `json:"index"`
		Delta        delta  `json:"delta"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *wireUsage `json:"usage"`
	Error *wireError `json:"error"`
}

// delta keeps the streamed strings raw so fragment can reassemble
// characters split across chunks.
type delta struct {
	Content          json.RawMessage `json:"content"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ToolCalls        []struct {
		Index    int    `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// reasoning returns the raw reasoning string: reasoning_content (DeepSeek,
// vLLM, llama.cpp) or reasoning (newer vLLM, Ollama).
func (d *delta) reasoning() json.RawMessage {
	if len(d.ReasoningContent) > 0 && string(d.ReasoningContent) != "null" {
		return d.ReasoningContent
	}
	return d.Reasoning
}

type wireError struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

func (e *wireError) detail() (string, string) {
	code := strings.Trim(string(e.Code), `"`)
	if code == "null" {
		code = ""
	}
	return strings.TrimSpace(e.Type + " " + code), e.Message
}

type wireUsage struct {
	PromptTokens         int64  `json:"prompt_tokens"`
	CompletionTokens     int64  `json:"completion_tokens"`
	PromptCacheHitTokens *int64 `json:"prompt_cache_hit_tokens"`
	PromptTokensDetails  *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens *int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// proto maps usage so counts stay disjoint: cache hits are subtracted from
// prompt_tokens; reasoning tokens stay inside output tokens.
func (u *wireUsage) proto() *llmv1.TokenUsage {
	out := &llmv1.TokenUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}
	var cached *int64
	if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
		cached = u.PromptTokensDetails.CachedTokens
	} else if u.PromptCacheHitTokens != nil {
		cached = u.PromptCacheHitTokens
	}
	if cached != nil {
		c := *cached
		out.CacheReadTokens = &c
		out.InputTokens = max(0, u.PromptTokens-c)
	}
	if u.CompletionTokensDetails != nil && u.CompletionTokensDetails.ReasoningTokens != nil {
		r := *u.CompletionTokensDetails.ReasoningTokens
		out.ReasoningTokens = &r
	}
	return out
}

// Body serialises req for the wire. It reports how many blocks the wire
// format cannot carry (extension blocks) and were dropped.
func (a *Adapter) Body(req *llmv1.GenerateRequest) ([]byte, int, error) {
	w, dropped := a.wire(req, 0, true)
	b, err := a.encode(&w)
	return b, dropped, err
}

// body is Body reusing, when bc holds one this adapter made, the encoding
// of the conversation's first messages from the request this one continues
// (the gateway's remembered conversation: the very same messages) and,
// when this request's tools are the very same schemas (same_tools), the
// encoding of the tools; it hands the encoding of all of this request's
// messages and of its tools to bc for the next. The parts' concatenation
// is Body's bytes: the messages array is the system message and then each
// message's wire messages, comma-separated, a message's wire form depends
// on nothing but the message and the adapter, and so does a tool's. The
// remembered messages and tools are parts of their own, not copied.
func (a *Adapter) body(req *llmv1.GenerateRequest, bc provider.BodyCache) ([][]byte, int, error) {
	if bc == nil {
		b, dropped, err := a.Body(req)
		return [][]byte{b}, dropped, err
	}
	var sp msgSpan
	from, dropped0, held := 0, 0, 0
	if p := bc.Prev(); p != nil && p.Owner == a {
		if p.N <= len(req.GetMessages()) {
			from, sp.cached, sp.cachedLen, dropped0 = p.N, p.Segments, p.Len(), p.Dropped
		}
		if p.SameTools(req.GetTools()) {
			sp.tools = p.ToolBytes
		}
		if sp.cachedLen > 0 || sp.tools != nil {
			held = p.HeldBytes()
		}
	}
	w, dropped := a.wire(req, from, sp.tools == nil)
	if req.System != nil {
		sp.nsys = 1
	}
	n := sizeHint(&w)
	b, err := a.appendRequest(make([]byte, 0, n+n/8+256), &w, &sp)
	if err != nil {
		return nil, 0, err
	}
	dropped += dropped0
	// The kept messages are the cached parts and this request's new ones
	// (a slice of b); the kept tools are the remembered ones or a slice of
	// b. A slice of b keeps all of b alive (the head, the spare capacity):
	// the cache counts all of it (Held), and what the cached parts and
	// tools kept alive. Not a copy: a copy measured 1.26x the gateway's CPU
	// per request at step 50 (the garbage collection its allocation
	// brings; docs/arch/throughput.md §13).
	kept := &provider.BodyPrefix{Owner: a, N: len(req.GetMessages()), Held: held, Dropped: dropped}
	if sp.end > sp.start || sp.toolsEnd > sp.toolsStart {
		// Only a kept slice of b keeps b alive: a continuation that adds
		// no message and reuses the tools holds nothing more.
		kept.Held += cap(b)
	}
	kept.Segments = append(make([][]byte, 0, len(sp.cached)+1), sp.cached...)
	if sp.end > sp.start {
		kept.Segments = append(kept.Segments, b[sp.start:sp.end:sp.end])
	}
	switch {
	case sp.tools != nil:
		kept.Tools, kept.ToolBytes = req.GetTools(), sp.tools
	case sp.toolsEnd > sp.toolsStart:
		kept.Tools, kept.ToolBytes = req.GetTools(), b[sp.toolsStart:sp.toolsEnd:sp.toolsEnd]
	}
	if len(kept.Segments) > maxSegments || (len(kept.Segments) >= minWasteSegments && kept.Held > 2*(kept.Len()+len(kept.ToolBytes))) {
		compact(kept)
	}
	bc.Keep(kept)
	return sp.parts(b), dropped, nil
}

// maxSegments bounds the parts a kept encoding is made of: one per step
// since the last compaction, each keeping its step's whole buffer (head,
// tail and spare capacity) alive, and each a part of every later body.
const maxSegments = 32

// minWasteSegments is how many parts a kept encoding has before it is
// also compacted when the buffers it keeps alive hold more than twice its
// bytes: each part keeps its step's whole buffer, the head (a long system
// prompt) and the tools when they were encoded again included, which
// over maxSegments steps held up to ~6x the body (a 10 KB system prompt, or the
// tools not the very same schemas); at most one copy of the conversation
// every minWasteSegments steps. Fewer parts are left as they are.
const minWasteSegments = 8

// compact copies p's messages and tools into one buffer of their size, so
// that the buffers of the steps they came from are released: at most one
// copy of the conversation every minWasteSegments steps where each step
// copied it before.
func compact(p *provider.BodyPrefix) {
	buf := make([]byte, 0, p.Len()+len(p.ToolBytes))
	for _, s := range p.Segments {
		buf = append(buf, s...)
	}
	p.Segments = [][]byte{buf[:len(buf):len(buf)]}
	if p.ToolBytes != nil {
		at := len(buf)
		buf = append(buf, p.ToolBytes...)
		p.ToolBytes = buf[at:len(buf):len(buf)]
	}
	p.Held = cap(buf)
}

// wire builds the request's wire form, leaving out the wire messages of
// the conversation's first from messages (the system message stays), and
// the tools unless withTools is set.
func (a *Adapter) wire(req *llmv1.GenerateRequest, from int, withTools bool) (wireRequest, int) {
	w := wireRequest{
		Model:         req.GetModel(),
		Stream:        true,
		StreamOptions: &streamOptions{IncludeUsage: true},
		Temperature:   req.Temperature,
		Stop:          req.GetStop(),
	}
	if a.d.MaxCompletionTokens {
		w.MaxCompletionTokens = req.MaxTokens
	} else {
		w.MaxTokens = req.MaxTokens
	}
	if a.cfg.Thinking != "" {
		w.Thinking = &thinking{Type: a.cfg.Thinking}
	}
	w.ReasoningEffort = a.cfg.ReasoningEffort
	if req.System != nil {
		w.Messages = append(w.Messages, wireMessage{Role: "system", Content: req.GetSystem()})
	}
	dropped := 0
	for _, m := range req.GetMessages()[from:] {
		var n int
		w.Messages, n = a.appendMessage(w.Messages, m)
		dropped += n
	}
	if !withTools {
		return w, dropped
	}
	if tools := req.GetTools(); len(tools) > 0 {
		w.Tools = make([]wireTool, 0, len(tools))
	}
	for _, t := range req.GetTools() {
		params := t.GetParameters()
		if params == "" {
			params = `{"type":"object","properties":{}}`
		}
		fn := wireFunction{Name: t.GetName(), Description: t.GetDescription(), ParamsText: params}
		if t.GetStrict() {
			fn.Strict = true
		}
		w.Tools = append(w.Tools, wireTool{Type: "function", Function: fn})
	}
	return w, dropped
}

func (a *Adapter) appendMessage(out []wireMessage, m *llmv1.Message) ([]wireMessage, int) {
	dropped := 0
	switch m.GetRole() {
	case llmv1.Role_ROLE_SYSTEM:
		var sb strings.Builder
		for _, b := range m.GetContent() {
			if t := b.GetText(); t != nil {
				sb.WriteString(t.GetText())
			} else {
				dropped++
			}
		}
		return append(out, wireMessage{Role: "system", Content: sb.String()}), dropped
	case llmv1.Role_ROLE_ASSISTANT:
		var text, reasoning strings.Builder
		msg := wireMessage{Role: "assistant"}
		for _, b := range m.GetContent() {
			switch v := b.GetBlock().(type) {
			case *llmv1.ContentBlock_Text:
				text.WriteString(v.Text.GetText())
			case *llmv1.ContentBlock_Reasoning:
				reasoning.WriteString(v.Reasoning.GetText())
			case *llmv1.ContentBlock_ToolCall:
				msg.ToolCalls = append(msg.ToolCalls, wireToolCall{ID: v.ToolCall.GetId(), Type: "function", Function: wireCall{Name: v.ToolCall.GetName(), Arguments: v.ToolCall.GetArguments()}})
			default:
				dropped++
			}
		}
		msg.Content = text.String() // an empty string, never null
		if a.d.ReasoningPassback && len(msg.ToolCalls) > 0 {
			r := reasoning.String()
			msg.ReasoningContent = &r
		}
		return append(out, msg), dropped
	default:
		// Tool results first: chat-completions servers require tool messages
		// right after the assistant message that called them. Images from
		// tool results (tool messages are text) move into the user message
		// that follows, ahead of the message's own content.
		var parts, moved []wirePart
		hasResults := false
		for _, b := range m.GetContent() {
			if !provider.ForModel(b) {
				continue
			}
			switch v := b.GetBlock().(type) {
			case *llmv1.ContentBlock_Text:
				parts = append(parts, wirePart{Type: "text", Text: v.Text.GetText()})
			case *llmv1.ContentBlock_Image:
				if why := a.imageReason(v.Image); why != "" {
					parts = append(parts, wirePart{Type: "text", Text: provider.Placeholder(b, why)})
				} else {
					parts = append(parts, wirePart{Type: "image_url", ImageURL: &wireImageURL{URL: imageURL(v.Image)}})
				}
			case *llmv1.ContentBlock_ToolResult:
				hasResults = true
				var content string
				var n int
				content, moved, n = a.toolResult(v.ToolResult, moved)
				dropped += n
				out = append(out, wireMessage{Role: "tool", ToolCallID: v.ToolResult.GetToolCallId(), Content: content})
			case *llmv1.ContentBlock_Audio, *llmv1.ContentBlock_Document, *llmv1.ContentBlock_ResourceLink:
				parts = append(parts, wirePart{Type: "text", Text: a.describe(b)})
			default:
				dropped++
			}
		}
		parts = append(moved, parts...)
		if len(parts) > 0 || !hasResults {
			msg := wireMessage{Role: "user"}
			if hasImage(parts) {
				msg.Content = parts
			} else {
				texts := make([]string, len(parts))
				for i, p := range parts {
					texts[i] = p.Text
				}
				msg.Content = strings.Join(texts, "\n")
			}
			out = append(out, msg)
		}
		return out, dropped
	}
}

// toolResult renders a tool result as the text of a tool message: its
// blocks one per line, a document's text under a heading, everything the
// route cannot carry described. Images the route takes in user messages
// are appended to moved (to follow in the next user message) and named in
// the text. Extension blocks are dropped and counted.
func (a *Adapter) toolResult(tr *llmv1.ToolResultBlock, moved []wirePart) (string, []wirePart, int) {
	var lines []string
	userOnly, dropped := false, 0
	for _, b := range tr.GetContent() {
		if !provider.ForModel(b) {
			userOnly = true
			continue
		}
		switch v := b.GetBlock().(type) {
		case *llmv1.ContentBlock_Text:
			lines = append(lines, v.Text.GetText())
		case *llmv1.ContentBlock_Image:
			if why := a.imageReason(v.Image); why != "" {
				lines = append(lines, provider.Placeholder(b, why))
				continue
			}
			lines = append(lines, provider.Placeholder(b, "")+" follows in the next user message")
			moved = append(moved,
				wirePart{Type: "text", Text: fmt.Sprintf("[image from tool call %s]", tr.GetToolCallId())},
				wirePart{Type: "image_url", ImageURL: &wireImageURL{URL: imageURL(v.Image)}})
		case *llmv1.ContentBlock_Audio, *llmv1.ContentBlock_Document, *llmv1.ContentBlock_ResourceLink:
			lines = append(lines, a.describe(b))
		default:
			dropped++
		}
	}
	if len(lines) == 0 {
		return provider.EmptyToolResult(userOnly), moved, dropped
	}
	return strings.Join(lines, "\n"), moved, dropped
}

// describe renders a non-text, non-image block as text: a document with
// text content as that text under a heading, anything else as a
// placeholder naming it.
func (a *Adapter) describe(b *llmv1.ContentBlock) string {
	switch v := b.GetBlock().(type) {
	case *llmv1.ContentBlock_Document:
		if t, ok := provider.DocumentText(v.Document); ok {
			return provider.DocumentHeading(v.Document) + "\n" + t
		}
		return provider.Placeholder(b, fmt.Sprintf("route %q takes documents only as text", a.cfg.Route))
	case *llmv1.ContentBlock_Audio:
		return provider.Placeholder(b, fmt.Sprintf("route %q does not take audio", a.cfg.Route))
	}
	return provider.Placeholder(b, "")
}

func hasImage(parts []wirePart) bool {
	for _, p := range parts {
		if p.ImageURL != nil {
			return true
		}
	}
	return false
}

func imageURL(img *llmv1.ImageBlock) string {
	if u := img.GetUrl(); u != "" {
		return u
	}
	return "data:" + provider.ImageMIME(img) + ";base64," + base64.StdEncoding.EncodeToString(img.GetData())
}

type wireRequest struct {
	Model               string         `json:"model"`
	Messages            []wireMessage  `json:"messages"`
	Tools               []wireTool     `json:"tools,omitempty"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	MaxTokens           *int32         `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int32         `json:"max_completion_tokens,omitempty"`
	Stop                []string       `json:"stop,omitempty"`
	Thinking            *thinking      `json:"thinking,omitempty"`
	ReasoningEffort     string         `json:"reasoning_effort,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type thinking struct {
	Type string `json:"type"`
}

type wireMessage struct {
	Role             string         `json:"role"`
	Content          any            `json:"content"`
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	ToolCalls        []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string         `json:"tool_call_id,omitempty"`
}

type wirePart struct {
	Type     string        `json:"type"`
	Text     string        `json:"text,omitempty"`
	ImageURL *wireImageURL `json:"image_url,omitempty"`
}

type wireImageURL struct {
	URL string `json:"url"`
}

type wireToolCall struct {
	ID       string   `json:"id"`
	Type     string   `json:"type"`
	Function wireCall `json:"function"`
}

type wireCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type wireTool struct {
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// ParamsText is the JSON Schema as JSON text; encode writes it as the
	// parameters value, compacted (see encode.go).
	ParamsText string          `json:"-"`
	Parameters json.RawMessage `json:"parameters"`
	Strict     bool            `json:"strict,omitempty"`
}
