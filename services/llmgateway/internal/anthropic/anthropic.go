// Package anthropic is the adapter for the Anthropic Messages API: thinking
// blocks streamed as reasoning with their signatures kept as replay state,
// tool_use input streamed as raw input_json deltas, cache_control breakpoints
// on the stable prefix (system, tools, the last history message), and cache
// token accounting mapped to cache_read / cache_write.
//
// # Ordering
//
// Harness blocks are numbered in the order the provider opens them and are
// closed at each content_block_stop; usage and finish are emitted only at
// message_stop, the end marker.
//
// # Replay state
//
// A successful finish carries {"v":1,"thinking":[{"block":i,"signature":s}],
// "redacted":[{"block":i,"data":d}]} when the response had thinking: block
// is the harness block index of the reasoning block the signature belongs
// to, or, for redacted thinking (which has no harness block), the position
// it is re-inserted at. Reasoning blocks without a signature are not sent
// back (the API would reject them).
package anthropic

import (
	"bytes"
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
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
)

// Defaults.
const (
	DefaultBaseURL   = "https://api.anthropic.com"
	DefaultVersion   = "2023-06-01"
	DefaultMaxTokens = 8192
)

// DefaultModels is the catalogue when none is configured.
func DefaultModels() []provider.Model {
	return []provider.Model{
		{ID: "claude-sonnet-4-5", Name: "Claude Sonnet 4.5", ContextWindow: 200_000},
		{ID: "claude-opus-4-5", Name: "Claude Opus 4.5", ContextWindow: 200_000},
		{ID: "claude-haiku-4-5", Name: "Claude Haiku 4.5", ContextWindow: 200_000},
	}
}

// Config configures one adapter instance.
type Config struct {
	// Route labels the provider in messages and logs.
	Route string
	// BaseURL is the API root; requests go to BaseURL + "/v1/messages".
	BaseURL string
	// APIKey is sent as x-api-key. Never logged.
	APIKey string
	// Version is the anthropic-version header.
	Version string
	// MaxTokens is sent when the request has none (the API requires it).
	MaxTokens int32
	// ThinkingBudget enables extended thinking with this many budget tokens
	// when > 0.
	ThinkingBudget int32
	// Models is the advisory catalogue.
	Models []provider.Model
	// Client sends the requests.
	Client upstream.Client
	// Logger receives the dropped-block counts.
	Logger *slog.Logger
}

// Adapter is the Anthropic Messages adapter.
type Adapter struct {
	cfg    Config
	url    string
	client upstream.Client
}

var _ provider.Adapter = (*Adapter)(nil)

// New returns an adapter; zero fields take the defaults above.
func New(cfg Config) *Adapter {
	if cfg.Route == "" {
		cfg.Route = "anthropic"
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	if len(cfg.Models) == 0 {
		cfg.Models = DefaultModels()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := cfg.Client
	c.RequestIDHeaders = []string{"request-id", "x-request-id"}
	if cfg.APIKey != "" {
		c.Secrets = append(append([]string(nil), c.Secrets...), cfg.APIKey)
	}
	return &Adapter{cfg: cfg, url: strings.TrimRight(cfg.BaseURL, "/") + "/v1/messages", client: c}
}

// Kind implements provider.Adapter.
func (a *Adapter) Kind() string { return "anthropic" }

// Models implements provider.Adapter.
func (a *Adapter) Models() []provider.Model { return a.cfg.Models }

// Validate implements provider.Adapter: images only in user messages. What
// the API cannot carry (audio, an image over its size bound or in a format
// it does not read, a binary document other than PDF) is not an error: Body
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

// Stream implements provider.Adapter.
func (a *Adapter) Stream(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	h := http.Header{}
	if a.cfg.APIKey != "" {
		h.Set("X-Api-Key", a.cfg.APIKey)
	}
	h.Set("Anthropic-Version", a.cfg.Version)
	return a.client.Stream(ctx, upstream.Call{Route: a.cfg.Route, URL: a.url, Header: h, Logger: a.cfg.Logger,
		Body: func() ([][]byte, int, error) {
			b, dropped, err := a.Body(req)
			return [][]byte{b}, dropped, err
		}, Translate: translate})
}

type replayState struct {
	V        int             `json:"v"`
	Thinking []thinkingEntry `json:"thinking,omitempty"`
	Redacted []redactedEntry `json:"redacted,omitempty"`
}

type thinkingEntry struct {
	Block     int    `json:"block"`
	Signature string `json:"signature"`
}

type redactedEntry struct {
	Block int    `json:"block"`
	Data  string `json:"data"`
}

type blockState struct {
	idx     uint32
	kind    string // text, thinking, tool_use
	input   json.RawMessage
	gotArgs bool
}

func translate(s *upstream.Stream, e *provider.Emitter) {
	blocks := map[int]*blockState{}
	var usage wireUsage
	var sawUsage bool
	var stop string
	var replay replayState
	var ev streamEvent
	var buf []byte
	for {
		raw, f := s.Next()
		if f != nil {
			e.Fail(f)
			return
		}
		ev = streamEvent{}
		if err := json.Unmarshal(raw.Data, &ev); err != nil {
			e.Fail(s.Fail(provider.CodeMalformedResponse, fmt.Sprintf("bad JSON in stream: %v; event: %.200s", err, raw.Data)))
			return
		}
		switch ev.Type {
		case "message_start":
			if ev.Message != nil && ev.Message.Usage != nil {
				usage.merge(ev.Message.Usage)
				sawUsage = true
			}
		case "content_block_start":
			cb := ev.ContentBlock
			if cb == nil {
				e.Fail(s.Fail(provider.CodeMalformedResponse, "content_block_start without content_block"))
				return
			}
			switch cb.Type {
			case "text":
				i, ok := e.Open(llmv1.BlockType_BLOCK_TYPE_TEXT)
				blocks[ev.Index] = &blockState{idx: i, kind: "text"}
				if !ok || (cb.Text != "" && !e.Text(i, cb.Text)) {
					return
				}
			case "thinking":
				i, ok := e.Open(llmv1.BlockType_BLOCK_TYPE_REASONING)
				blocks[ev.Index] = &blockState{idx: i, kind: "thinking"}
				if !ok || (cb.Thinking != "" && !e.Reasoning(i, cb.Thinking)) {
					return
				}
				if cb.Signature != "" {
					replay.Thinking = append(replay.Thinking, thinkingEntry{Block: int(i), Signature: cb.Signature})
				}
			case "redacted_thinking":
				replay.Redacted = append(replay.Redacted, redactedEntry{Block: e.Len(), Data: cb.Data})
			case "tool_use":
				i, ok := e.OpenToolCall(cb.ID, cb.Name)
				blocks[ev.Index] = &blockState{idx: i, kind: "tool_use", input: cb.Input}
				if !ok || !e.ToolArgs(i, cb.Name, "") {
					return
				}
			}
		case "content_block_delta":
			b := blocks[ev.Index]
			if b == nil || ev.Delta == nil {
				continue // a block type we do not surface
			}
			d := ev.Delta
			var raw json.RawMessage
			switch d.Type {
			case "text_delta":
				if b.kind == "text" {
					raw = d.Text
				}
			case "thinking_delta":
				if b.kind == "thinking" {
					raw = d.Thinking
				}
			case "input_json_delta":
				if b.kind == "tool_use" {
					raw = d.PartialJSON
				}
			case "signature_delta":
				if b.kind == "thinking" {
					replay.Thinking = append(replay.Thinking, thinkingEntry{Block: int(b.idx), Signature: d.Signature})
				}
			}
			if len(raw) == 0 {
				continue
			}
			var err error
			if buf, err = fragment.Unquote(buf[:0], raw); err != nil {
				e.Fail(s.Fail(provider.CodeMalformedResponse, "bad string in "+d.Type))
				return
			}
			if len(buf) == 0 {
				continue
			}
			if b.kind == "tool_use" {
				b.gotArgs = true
			}
			if !e.Fragment(b.idx, "", buf) {
				return
			}
		case "content_block_stop":
			b := blocks[ev.Index]
			if b == nil {
				continue
			}
			if b.kind == "tool_use" && !b.gotArgs && !e.ToolArgs(b.idx, "", compactObject(b.input)) {
				return
			}
			if !e.End(b.idx) {
				return
			}
		case "message_delta":
			if ev.Delta != nil && ev.Delta.StopReason != "" {
				stop = ev.Delta.StopReason
			}
			if ev.Usage != nil {
				usage.merge(ev.Usage)
				sawUsage = true
			}
		case "message_stop":
			s.End()
			if !e.EndAll() {
				return
			}
			if sawUsage && !e.Usage(usage.proto()) {
				return
			}
			var rs *string
			if len(replay.Thinking) > 0 || len(replay.Redacted) > 0 {
				replay.V = 1
				b, _ := json.Marshal(replay)
				str := string(b)
				rs = &str
			}
			e.Finish(finishReason(stop), rs)
			return
		case "error":
			kind, msg := "", "provider error"
			if ev.Error != nil {
				kind, msg = ev.Error.Type, ev.Error.Message
			}
			e.Fail(s.Fail(provider.ClassifyDetail(kind, msg), "provider error mid-stream: "+msg))
			return
		}
	}
}

func compactObject(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return "{}"
	}
	return buf.String()
}

func finishReason(r string) *llmv1.FinishReason {
	switch r {
	case "end_turn", "stop_sequence", "":
		return provider.Stop()
	case "tool_use":
		return provider.ToolCalls()
	case "max_tokens":
		return provider.MaxTokens()
	case "model_context_window_exceeded":
		return (&provider.Failure{Code: provider.CodeContextWindowExceeded, Message: "model stopped: " + r}).Finish().GetFinish().GetReason()
	}
	return provider.StoppedFor(r)
}

type streamEvent struct {
	Type         string            `json:"type"`
	Index        int               `json:"index"`
	Message      *wireMessageStart `json:"message"`
	ContentBlock *wireBlock        `json:"content_block"`
	Delta        *wireDelta        `json:"delta"`
	Usage        *wireUsageIn      `json:"usage"`
	Error        *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

type wireMessageStart struct {
	ID    string       `json:"id"`
	Usage *wireUsageIn `json:"usage"`
}

type wireBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
	Data      string          `json:"data"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
}

// wireDelta keeps streamed strings raw for fragment.
type wireDelta struct {
	Type        string          `json:"type"`
	Text        json.RawMessage `json:"text"`
	Thinking    json.RawMessage `json:"thinking"`
	Signature   string          `json:"signature"`
	PartialJSON json.RawMessage `json:"partial_json"`
	StopReason  string          `json:"stop_reason"`
}

type wireUsageIn struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
}

type wireUsage struct {
	input, output         int64
	cacheRead, cacheWrite *int64
}

// merge folds a usage object in: message_delta usage is cumulative, so later
// values replace earlier ones field by field.
func (u *wireUsage) merge(in *wireUsageIn) {
	if in.InputTokens != nil {
		u.input = *in.InputTokens
	}
	if in.OutputTokens != nil {
		u.output = *in.OutputTokens
	}
	if in.CacheReadInputTokens != nil {
		v := *in.CacheReadInputTokens
		u.cacheRead = &v
	}
	if in.CacheCreationInputTokens != nil {
		v := *in.CacheCreationInputTokens
		u.cacheWrite = &v
	}
}

func (u *wireUsage) proto() *llmv1.TokenUsage {
	return &llmv1.TokenUsage{InputTokens: u.input, OutputTokens: u.output, CacheReadTokens: u.cacheRead, CacheWriteTokens: u.cacheWrite}
}

// ---- request serialisation ----

type wireRequest struct {
	Model         string        `json:"model"`
	MaxTokens     int32         `json:"max_tokens"`
	System        []wireContent `json:"system,omitempty"`
	Messages      []wireMessage `json:"messages"`
	Tools         []wireTool    `json:"tools,omitempty"`
	Stream        bool          `json:"stream"`
	Temperature   *float64      `json:"temperature,omitempty"`
	StopSequences []string      `json:"stop_sequences,omitempty"`
	Thinking      *wireThinking `json:"thinking,omitempty"`
}

type wireThinking struct {
	Type         string `json:"type"`
	BudgetTokens int32  `json:"budget_tokens"`
}

type cacheControl struct {
	Type string `json:"type"`
}

var ephemeral = &cacheControl{Type: "ephemeral"}

type wireMessage struct {
	Role    string        `json:"role"`
	Content []wireContent `json:"content"`
}

type wireContent struct {
	Type         string          `json:"type"`
	Text         string          `json:"text,omitempty"`
	Thinking     string          `json:"thinking,omitempty"`
	Signature    string          `json:"signature,omitempty"`
	Data         string          `json:"data,omitempty"`
	ID           string          `json:"id,omitempty"`
	Name         string          `json:"name,omitempty"`
	Input        json.RawMessage `json:"input,omitempty"`
	ToolUseID    string          `json:"tool_use_id,omitempty"`
	Content      []wireContent   `json:"content,omitempty"`
	IsError      bool            `json:"is_error,omitempty"`
	Source       *wireSource     `json:"source,omitempty"`
	Title        string          `json:"title,omitempty"`
	CacheControl *cacheControl   `json:"cache_control,omitempty"`
}

type wireSource struct {
	Type      string `json:"type"`
	URL       string `json:"url,omitempty"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
}

type wireTool struct {
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl *cacheControl   `json:"cache_control,omitempty"`
}

// Body serialises req for the wire and reports how many blocks were dropped
// (extension blocks, unsigned reasoning).
func (a *Adapter) Body(req *llmv1.GenerateRequest) ([]byte, int, error) {
	w := wireRequest{Model: req.GetModel(), MaxTokens: a.cfg.MaxTokens, Stream: true, Temperature: req.Temperature, StopSequences: req.GetStop()}
	if req.MaxTokens != nil {
		w.MaxTokens = req.GetMaxTokens()
	}
	if a.cfg.ThinkingBudget > 0 {
		w.Thinking = &wireThinking{Type: "enabled", BudgetTokens: a.cfg.ThinkingBudget}
	}
	if s := req.GetSystem(); s != "" {
		w.System = append(w.System, wireContent{Type: "text", Text: s})
	}
	dropped := 0
	for _, m := range req.GetMessages() {
		if m.GetRole() == llmv1.Role_ROLE_SYSTEM {
			for _, b := range m.GetContent() {
				if t := b.GetText().GetText(); t != "" {
					w.System = append(w.System, wireContent{Type: "text", Text: t})
				} else if b.GetText() == nil {
					dropped++
				}
			}
			continue
		}
		role, content, n := a.message(m)
		dropped += n
		if len(content) == 0 {
			continue
		}
		if k := len(w.Messages); k > 0 && w.Messages[k-1].Role == role {
			prev := &w.Messages[k-1]
			if role == "user" {
				// tool_result blocks must lead a user turn.
				prev.Content = mergeUser(prev.Content, content)
			} else {
				prev.Content = append(prev.Content, content...)
			}
			continue
		}
		w.Messages = append(w.Messages, wireMessage{Role: role, Content: content})
	}
	for _, t := range req.GetTools() {
		schema := json.RawMessage(t.GetParameters())
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		w.Tools = append(w.Tools, wireTool{Name: t.GetName(), Description: t.GetDescription(), InputSchema: schema})
	}
	// Cache breakpoints: the stable prefix is system, tools, then history.
	if n := len(w.System); n > 0 {
		w.System[n-1].CacheControl = ephemeral
	}
	if n := len(w.Tools); n > 0 {
		w.Tools[n-1].CacheControl = ephemeral
	}
	if n := len(w.Messages); n > 0 {
		c := w.Messages[n-1].Content
		for i := len(c) - 1; i >= 0; i-- {
			if c[i].Type != "thinking" && c[i].Type != "redacted_thinking" {
				c[i].CacheControl = ephemeral
				break
			}
		}
	}
	b, err := json.Marshal(&w)
	return b, dropped, err
}

func mergeUser(prev, next []wireContent) []wireContent {
	var results, rest []wireContent
	for _, c := range append(append([]wireContent(nil), prev...), next...) {
		if c.Type == "tool_result" {
			results = append(results, c)
		} else {
			rest = append(rest, c)
		}
	}
	return append(results, rest...)
}

func (a *Adapter) message(m *llmv1.Message) (string, []wireContent, int) {
	dropped := 0
	if m.GetRole() == llmv1.Role_ROLE_ASSISTANT {
		rs := parseReplay(m.GetProvenance().GetReplayState())
		sigs := map[int]string{}
		for _, t := range rs.Thinking {
			sigs[t.Block] = t.Signature
		}
		var out []wireContent
		redacted := func(pos int) {
			for _, r := range rs.Redacted {
				if r.Block == pos {
					out = append(out, wireContent{Type: "redacted_thinking", Data: r.Data})
				}
			}
		}
		for i, b := range m.GetContent() {
			redacted(i)
			switch v := b.GetBlock().(type) {
			case *llmv1.ContentBlock_Text:
				if v.Text.GetText() != "" {
					out = append(out, wireContent{Type: "text", Text: v.Text.GetText()})
				}
			case *llmv1.ContentBlock_Reasoning:
				if sig, ok := sigs[i]; ok {
					out = append(out, wireContent{Type: "thinking", Thinking: v.Reasoning.GetText(), Signature: sig})
				} else {
					dropped++
				}
			case *llmv1.ContentBlock_ToolCall:
				out = append(out, wireContent{Type: "tool_use", ID: v.ToolCall.GetId(), Name: v.ToolCall.GetName(), Input: toolInput(v.ToolCall.GetArguments())})
			default:
				dropped++
			}
		}
		redacted(len(m.GetContent()))
		return "assistant", out, dropped
	}
	var results, rest []wireContent
	for _, b := range m.GetContent() {
		if !provider.ForModel(b) {
			continue
		}
		switch v := b.GetBlock().(type) {
		case *llmv1.ContentBlock_Text:
			if v.Text.GetText() != "" {
				rest = append(rest, wireContent{Type: "text", Text: v.Text.GetText()})
			}
		case *llmv1.ContentBlock_ToolResult:
			r := wireContent{Type: "tool_result", ToolUseID: v.ToolResult.GetToolCallId(), IsError: v.ToolResult.GetIsError()}
			userOnly := false
			for _, rb := range v.ToolResult.GetContent() {
				if !provider.ForModel(rb) {
					userOnly = true
					continue
				}
				if t := rb.GetText(); t != nil {
					if t.GetText() != "" {
						r.Content = append(r.Content, wireContent{Type: "text", Text: t.GetText()})
					}
					continue
				}
				if c, ok := a.media(rb); ok {
					r.Content = append(r.Content, c)
				} else {
					dropped++
				}
			}
			if len(r.Content) == 0 {
				r.Content = []wireContent{{Type: "text", Text: provider.EmptyToolResult(userOnly)}}
			}
			results = append(results, r)
		default:
			if c, ok := a.media(b); ok {
				rest = append(rest, c)
			} else {
				dropped++
			}
		}
	}
	return "user", append(results, rest...), dropped
}

// maxImageBytes is the Messages API's bound on one image.
const maxImageBytes = 5 << 20

// media renders an image, document, audio or resource-link block (in a
// user message or a tool result, which take the same blocks): as itself
// when the API takes it, else as a placeholder text naming it. ok is false
// for a block type the wire cannot express at all (an extension): dropped.
func (a *Adapter) media(b *llmv1.ContentBlock) (wireContent, bool) {
	placeholder := func(why string) wireContent {
		return wireContent{Type: "text", Text: provider.Placeholder(b, why)}
	}
	switch v := b.GetBlock().(type) {
	case *llmv1.ContentBlock_Image:
		if why := provider.ImageReason(v.Image, maxImageBytes); why != "" {
			return placeholder(why), true
		}
		return image(v.Image), true
	case *llmv1.ContentBlock_Document:
		d := v.Document
		title := d.GetName()
		if title == "" {
			title = d.GetUri()
		}
		if t, ok := provider.DocumentText(d); ok {
			return wireContent{Type: "document", Title: title, Source: &wireSource{Type: "text", MediaType: "text/plain", Data: t}}, true
		}
		if strings.EqualFold(d.GetMimeType(), "application/pdf") && d.GetData() != nil {
			return wireContent{Type: "document", Title: title, Source: &wireSource{Type: "base64", MediaType: "application/pdf", Data: base64.StdEncoding.EncodeToString(d.GetData())}}, true
		}
		return placeholder("the route takes documents as text or PDF only"), true
	case *llmv1.ContentBlock_Audio:
		return placeholder(fmt.Sprintf("route %q does not take audio", a.cfg.Route)), true
	case *llmv1.ContentBlock_ResourceLink:
		return placeholder(""), true
	}
	return wireContent{}, false
}

func image(img *llmv1.ImageBlock) wireContent {
	if u := img.GetUrl(); u != "" {
		if mt, data, ok := provider.ParseDataURL(u); ok {
			return wireContent{Type: "image", Source: &wireSource{Type: "base64", MediaType: mt, Data: data}}
		}
		return wireContent{Type: "image", Source: &wireSource{Type: "url", URL: u}}
	}
	return wireContent{Type: "image", Source: &wireSource{Type: "base64", MediaType: provider.ImageMIME(img), Data: base64.StdEncoding.EncodeToString(img.GetData())}}
}

// toolInput turns raw argument text into the JSON object the API requires:
// a valid object passes verbatim; empty text is {}; anything else (the model
// produced invalid JSON) is wrapped as {"arguments": "<raw text>"} so the
// model still sees what it sent.
func toolInput(args string) json.RawMessage {
	trimmed := strings.TrimSpace(args)
	if trimmed == "" {
		return json.RawMessage(`{}`)
	}
	if strings.HasPrefix(trimmed, "{") && json.Valid([]byte(trimmed)) {
		return json.RawMessage(trimmed)
	}
	b, _ := json.Marshal(map[string]string{"arguments": args})
	return b
}

func parseReplay(s string) replayState {
	var rs replayState
	if s == "" || json.Unmarshal([]byte(s), &rs) != nil || rs.V != 1 {
		return replayState{}
	}
	return rs
}
