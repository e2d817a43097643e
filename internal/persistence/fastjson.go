package persistence

import (
	"strconv"
	"unicode/utf8"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// appendDeltaChunk writes, without protojson, the canonical JSON of the
// event kind that makes up most of a real log: an assistant/chunk carrying a
// text or reasoning delta with every field set. The bytes are exactly
// session.MarshalEventJSON's (FuzzDeltaChunkJSON checks it); any other
// event, or one with a zero field or unknown fields, is declined (ok false)
// and takes the protojson path.
func appendDeltaChunk(dst []byte, ev *sessionv1.SessionEvent) (out []byte, ok bool) {
	ac := ev.GetAssistantChunk()
	if ac == nil || len(ac.GetChunks()) > 0 || ev.GetSeq() <= 0 || ev.GetTime() <= 0 || ac.GetTurn() <= 0 || ac.GetStep() <= 0 ||
		ev.GetSurfaceOp() != nil || ev.GetSourceEventSeqs() != nil ||
		len(ev.ProtoReflect().GetUnknown()) > 0 || len(ac.ProtoReflect().GetUnknown()) > 0 ||
		len(ac.GetChunk().ProtoReflect().GetUnknown()) > 0 {
		return nil, false
	}
	var (
		kind  string
		index uint32
		text  string
	)
	switch {
	case ac.GetChunk().GetTextDelta() != nil:
		d := ac.GetChunk().GetTextDelta()
		if len(d.ProtoReflect().GetUnknown()) > 0 {
			return nil, false
		}
		kind, index, text = "text_delta", d.GetIndex(), d.GetText()
	case ac.GetChunk().GetReasoningDelta() != nil:
		d := ac.GetChunk().GetReasoningDelta()
		if len(d.ProtoReflect().GetUnknown()) > 0 {
			return nil, false
		}
		kind, index, text = "reasoning_delta", d.GetIndex(), d.GetText()
	default:
		return nil, false
	}
	if text == "" || !utf8.ValidString(text) {
		return nil, false
	}
	out = append(dst, `{"seq":"`...)
	out = strconv.AppendInt(out, ev.GetSeq(), 10)
	out = append(out, `","time":"`...)
	out = strconv.AppendInt(out, ev.GetTime(), 10)
	out = append(out, `","assistant_chunk":{"turn":`...)
	out = strconv.AppendInt(out, int64(ac.GetTurn()), 10)
	out = append(out, `,"step":`...)
	out = strconv.AppendInt(out, int64(ac.GetStep()), 10)
	out = append(out, `,"chunk":{"`...)
	out = append(out, kind...)
	out = append(out, `":{`...)
	if index != 0 {
		out = append(out, `"index":`...)
		out = strconv.AppendUint(out, uint64(index), 10)
		out = append(out, ',')
	}
	out = append(out, `"text":`...)
	out = appendJSONString(out, text)
	return append(out, `}}}}`...), true
}

// appendJSONString quotes valid UTF-8 the way protojson does: only '"',
// '\\' and control characters are escaped (\b \f \n \r \t, else \u00XX in
// lower-case hex).
func appendJSONString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[start:i]...)
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
