package chat

import (
	"strconv"

	json "github.com/segmentio/encoding/json"
)

// The request body is written by hand instead of by reflection: encoding
// it with json.Marshal was 19 % of the gateway's CPU at 1,000 sessions
// (docs/arch/throughput-gateway.md), most of it re-parsing and compacting
// the same tool schemas on every request and growing and copying buffers.
// encode writes exactly the bytes json.Marshal(&w) wrote (the segmentio
// encoder's own string escaping, HTML-safe; the schema compacted by the
// same encoder, once per distinct schema): FuzzEncode and TestEncodeLoad
// compare the two byte for byte.

// maxSchemas bounds the encoded tool schemas an adapter remembers.
const maxSchemas = 4096

// encodeRaw encodes a tool schema (JSON text) as json.Marshal encodes a
// json.RawMessage holding it: its first value, compacted, HTML-escaped.
func encodeRaw(s string) ([]byte, error) {
	return json.Append(nil, json.RawMessage(s), json.EscapeHTML)
}

// encode writes w as JSON into one buffer sized from the text it holds
// (plus an eighth for escapes), so a typical body is allocated once and
// never copied.
func (a *Adapter) encode(w *wireRequest) ([]byte, error) {
	n := sizeHint(w)
	return a.appendRequest(make([]byte, 0, n+n/8+256), w, &msgSpan{})
}

// msgSpan places the conversation in the messages array: the first nsys
// wire messages are the system slot, cached is the encoding of the
// conversation's first wire messages (comma-separated, in parts whose
// concatenation it is: cachedLen bytes), which belongs in the body before
// the rest, and tools, when set, is the encoding of the tools array's
// elements (comma-separated). appendRequest writes neither cached nor tools
// into the buffer: it sets start to where cached belongs (then the rest of
// the conversation's wire messages, up to end) and toolsAt to where tools
// belong (toolsStart and toolsEnd bracket the tools it encoded itself), so
// that the body is the buffer with them in between (msgSpan.parts) and the
// remembered bytes are sent as they are, not copied into a fresh buffer
// per request (docs/arch/throughput.md §26).
type msgSpan struct {
	nsys                 int
	cached               [][]byte
	cachedLen            int
	start, end           int
	tools                []byte
	toolsAt              int
	toolsStart, toolsEnd int
}

// parts is the body appendRequest wrote into b with the cached messages
// and the remembered tools in their places, in order; no part is empty.
func (sp *msgSpan) parts(b []byte) [][]byte {
	parts := make([][]byte, 0, len(sp.cached)+4)
	add := func(p []byte) {
		if len(p) > 0 {
			parts = append(parts, p[:len(p):len(p)])
		}
	}
	add(b[:sp.start])
	for _, c := range sp.cached {
		add(c)
	}
	if len(sp.tools) > 0 {
		add(b[sp.start:sp.toolsAt])
		add(sp.tools)
		add(b[sp.toolsAt:])
	} else {
		add(b[sp.start:])
	}
	return parts
}

// sizeHint is the length of the text in w and of its fixed syntax,
// roughly: the encoded body's length when nothing needs escaping.
func sizeHint(w *wireRequest) int {
	n := 96 + len(w.Model)
	for i := range w.Messages {
		m := &w.Messages[i]
		n += 48 + len(m.ToolCallID)
		switch c := m.Content.(type) {
		case string:
			n += len(c)
		case []wirePart:
			for _, p := range c {
				n += 48 + len(p.Text)
				if p.ImageURL != nil {
					n += len(p.ImageURL.URL)
				}
			}
		}
		if m.ReasoningContent != nil {
			n += 24 + len(*m.ReasoningContent)
		}
		for _, tc := range m.ToolCalls {
			n += 64 + len(tc.ID) + len(tc.Function.Name) + len(tc.Function.Arguments)*9/8
		}
	}
	for _, t := range w.Tools {
		n += 80 + len(t.Function.Name) + len(t.Function.Description) + len(t.Function.ParamsText)
	}
	if len(w.Tools) > 0 {
		n += 12 // ,"tools":[]
	}
	return n
}

func appendString(b []byte, s string) []byte { return json.AppendEscape(b, s, json.EscapeHTML) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, "true"...)
	}
	return append(b, "false"...)
}

func (a *Adapter) appendRequest(b []byte, w *wireRequest, sp *msgSpan) ([]byte, error) {
	b = append(b, `{"model":`...)
	b = appendString(b, w.Model)
	b = append(b, `,"messages":`...)
	if w.Messages == nil && sp.cachedLen == 0 {
		b = append(b, "null"...)
		sp.start, sp.end = len(b), len(b)
	} else {
		b = append(b, '[')
		for i := range sp.nsys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendMessage(b, &w.Messages[i])
		}
		if sp.nsys > 0 && (sp.cachedLen > 0 || len(w.Messages) > sp.nsys) {
			b = append(b, ',')
		}
		sp.start = len(b) // the cached messages go here (parts)
		for i := sp.nsys; i < len(w.Messages); i++ {
			if len(b) > sp.start || sp.cachedLen > 0 {
				b = append(b, ',')
			}
			b = appendMessage(b, &w.Messages[i])
		}
		sp.end = len(b)
		b = append(b, ']')
	}
	if len(sp.tools) > 0 {
		b = append(b, `,"tools":[`...)
		sp.toolsAt = len(b) // the remembered tools go here (parts)
		b = append(b, ']')
	} else if len(w.Tools) > 0 {
		b = append(b, `,"tools":[`...)
		sp.toolsStart = len(b)
		for i := range w.Tools {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = a.appendTool(b, &w.Tools[i]); err != nil {
				return b, err
			}
		}
		sp.toolsEnd = len(b)
		b = append(b, ']')
	}
	b = append(b, `,"stream":`...)
	b = appendBool(b, w.Stream)
	if w.StreamOptions != nil {
		b = append(b, `,"stream_options":{"include_usage":`...)
		b = appendBool(b, w.StreamOptions.IncludeUsage)
		b = append(b, '}')
	}
	if w.Temperature != nil {
		b = append(b, `,"temperature":`...)
		var err error
		if b, err = json.Append(b, *w.Temperature, json.EscapeHTML); err != nil {
			return b, err
		}
	}
	if w.MaxTokens != nil {
		b = append(b, `,"max_tokens":`...)
		b = strconv.AppendInt(b, int64(*w.MaxTokens), 10)
	}
	if w.MaxCompletionTokens != nil {
		b = append(b, `,"max_completion_tokens":`...)
		b = strconv.AppendInt(b, int64(*w.MaxCompletionTokens), 10)
	}
	if len(w.Stop) > 0 {
		b = append(b, `,"stop":[`...)
		for i, s := range w.Stop {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		b = append(b, ']')
	}
	if w.Thinking != nil {
		b = append(b, `,"thinking":{"type":`...)
		b = appendString(b, w.Thinking.Type)
		b = append(b, '}')
	}
	if w.ReasoningEffort != "" {
		b = append(b, `,"reasoning_effort":`...)
		b = appendString(b, w.ReasoningEffort)
	}
	return append(b, '}'), nil
}

func appendMessage(b []byte, m *wireMessage) []byte {
	b = append(b, `{"role":`...)
	b = appendString(b, m.Role)
	b = append(b, `,"content":`...)
	switch c := m.Content.(type) {
	case string:
		b = appendString(b, c)
	case []wirePart:
		if c == nil {
			b = append(b, "null"...)
			break
		}
		b = append(b, '[')
		for i := range c {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendPart(b, &c[i])
		}
		b = append(b, ']')
	default: // nil: Body sets a string or parts on every message
		b = append(b, "null"...)
	}
	if m.ReasoningContent != nil {
		b = append(b, `,"reasoning_content":`...)
		b = appendString(b, *m.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i := range m.ToolCalls {
			tc := &m.ToolCalls[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendString(b, tc.ID)
			b = append(b, `,"type":`...)
			b = appendString(b, tc.Type)
			b = append(b, `,"function":{"name":`...)
			b = appendString(b, tc.Function.Name)
			b = append(b, `,"arguments":`...)
			b = appendString(b, tc.Function.Arguments)
			b = append(b, `}}`...)
		}
		b = append(b, ']')
	}
	if m.ToolCallID != "" {
		b = append(b, `,"tool_call_id":`...)
		b = appendString(b, m.ToolCallID)
	}
	return append(b, '}')
}

func appendPart(b []byte, p *wirePart) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, p.Type)
	if p.Text != "" {
		b = append(b, `,"text":`...)
		b = appendString(b, p.Text)
	}
	if p.ImageURL != nil {
		b = append(b, `,"image_url":{"url":`...)
		b = appendString(b, p.ImageURL.URL)
		b = append(b, '}')
	}
	return append(b, '}')
}

func (a *Adapter) appendTool(b []byte, t *wireTool) ([]byte, error) {
	b = append(b, `{"type":`...)
	b = appendString(b, t.Type)
	b = append(b, `,"function":{"name":`...)
	b = appendString(b, t.Function.Name)
	if t.Function.Description != "" {
		b = append(b, `,"description":`...)
		b = appendString(b, t.Function.Description)
	}
	b = append(b, `,"parameters":`...)
	raw, err := a.params.Get(t.Function.ParamsText)
	if err != nil {
		return b, err
	}
	b = append(b, raw...)
	if t.Function.Strict {
		b = append(b, `,"strict":true`...)
	}
	return append(b, `}}`...), nil
}
