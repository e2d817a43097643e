package jsonlstore

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// decodeDeltaChunk decodes, without protojson, the one line shape that makes
// up most of a real log: an assistant/chunk event carrying a text or
// reasoning delta, exactly as session.MarshalEventJSON writes it:
//
//	{"seq":"N","time":"T","assistant_chunk":{"turn":A,"step":B,"chunk":{"text_delta":{["index":I,]"text":"..."}}}}
//
// It declines (ok false) anything else, including every variation protojson
// would also accept (other spacing, field order or names, omitted zero
// fields), which then takes the protojson path. FuzzDeltaChunk checks that
// whenever it accepts a line, protojson decodes the same event.
func decodeDeltaChunk(b []byte) (ev *sessionv1.SessionEvent, ok bool) {
	p := parser{b: b}
	if !p.lit(`{"seq":"`) {
		return nil, false
	}
	seq, ok := p.uint(63)
	if !ok || !p.lit(`","time":"`) {
		return nil, false
	}
	tm, ok := p.uint(63)
	if !ok || !p.lit(`","assistant_chunk":{"turn":`) {
		return nil, false
	}
	turn, ok := p.uint(31)
	if !ok || !p.lit(`,"step":`) {
		return nil, false
	}
	step, ok := p.uint(31)
	if !ok || !p.lit(`,"chunk":{"`) {
		return nil, false
	}
	reasoning := false
	switch {
	case p.lit(`text_delta":{`):
	case p.lit(`reasoning_delta":{`):
		reasoning = true
	default:
		return nil, false
	}
	var index uint64
	if p.lit(`"index":`) {
		if index, ok = p.uint(32); !ok || !p.lit(`,`) {
			return nil, false
		}
	}
	if !p.lit(`"text":`) {
		return nil, false
	}
	text, ok := p.str()
	if !ok || text == "" || !p.lit(`}}}}`) || p.i != len(b) {
		return nil, false
	}
	chunk := &llmv1.StreamChunk{}
	if reasoning {
		chunk.Chunk = &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: uint32(index), Text: text}}
	} else {
		chunk.Chunk = &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: uint32(index), Text: text}}
	}
	return &sessionv1.SessionEvent{
		Seq:  int64(seq),
		Time: int64(tm),
		Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{
			Turn: int32(turn), Step: int32(step), Chunk: chunk,
		}},
	}, true
}

type parser struct {
	b []byte
	i int
}

func (p *parser) lit(s string) bool {
	if bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		p.i += len(s)
		return true
	}
	return false
}

// uint reads a positive decimal without leading zeros (MarshalEventJSON
// omits zero values) that fits in bits bits.
func (p *parser) uint(bits int) (uint64, bool) {
	j := p.i
	for j < len(p.b) && p.b[j] >= '0' && p.b[j] <= '9' {
		j++
	}
	if j == p.i || p.b[p.i] == '0' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.b[p.i:j]), 10, bits)
	if err != nil {
		return 0, false
	}
	p.i = j
	return v, true
}

// str reads a JSON string of valid UTF-8.
func (p *parser) str() (string, bool) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false
	}
	j := p.i + 1
	escaped := false
	for ; j < len(p.b); j++ {
		c := p.b[j]
		if c == '\\' {
			escaped = true
			j++
			continue
		}
		if c == '"' {
			break
		}
		if c < 0x20 {
			return "", false
		}
	}
	if j >= len(p.b) {
		return "", false
	}
	raw := p.b[p.i : j+1]
	p.i = j + 1
	if !escaped {
		if !utf8.Valid(raw[1 : len(raw)-1]) {
			return "", false
		}
		return string(raw[1 : len(raw)-1]), true
	}
	if !utf8.Valid(raw) || surrogateEscape(raw) {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || !utf8.ValidString(s) {
		return "", false
	}
	return s, true
}

// surrogateEscape reports a \uD800-\uDFFF escape, which encoding/json and
// protojson may treat differently (MarshalEventJSON never writes one).
func surrogateEscape(raw []byte) bool {
	for i := 0; i+3 < len(raw); i++ {
		if raw[i] == '\\' {
			if raw[i+1] == 'u' && (raw[i+2] == 'd' || raw[i+2] == 'D') && bytes.IndexByte([]byte("89abAB"), raw[i+3]) >= 0 {
				return true
			}
			i++ // skip the escaped byte
		}
	}
	return false
}
