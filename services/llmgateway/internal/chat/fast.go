package chat

import (
	"bytes"
	"unicode/utf8"
)

// The fast path decodes the event shapes that make up almost every
// chat-completions stream — a single choice whose delta carries only text
// (content, reasoning_content or reasoning), or exactly one tool call's
// index, id, name and argument fragment, with an escape-free finish reason
// or none, and no usage or error — without reflection. Anything else,
// including anything it does not fully understand or malformed JSON,
// returns ok=false and the caller falls back to the full decoder, so
// behaviour never depends on which path ran. FuzzFastDelta checks the two
// agree.

// fastDelta is what the fast path extracts: raw JSON string literals (or
// nil when absent or null).
type fastDelta struct {
	content, reasoningContent, reasoning []byte
	// tool is set when the delta carries one tool call.
	tool bool
	// toolIndex is its index; toolID and toolName its id and name
	// (unquoted: only escape-free strings are taken), args its raw
	// arguments literal (or nil).
	toolIndex        int
	toolID, toolName string
	args             []byte
	// finish is the choice's finish_reason ("" when absent or null).
	finish string
}

// parseFast decodes data when it has the common shape.
func parseFast(data []byte) (fastDelta, bool) {
	var d fastDelta
	p := scanner{b: data}
	p.ws()
	if !p.lit('{') {
		return d, false
	}
	sawChoices := false
	for first := true; ; first = false {
		key, done, ok := p.member(first)
		if !ok {
			return d, false
		}
		if done {
			break
		}
		switch string(key) {
		case `"choices"`:
			if sawChoices || !p.choices(&d) {
				return d, false
			}
			sawChoices = true
		case `"usage"`, `"error"`:
			if !p.null() {
				return d, false
			}
		default:
			// encoding/json matches keys case-insensitively and after
			// unescaping; leave any key that could alias ours to it.
			if bytes.IndexByte(key, '\\') >= 0 || bytes.EqualFold(key, []byte(`"choices"`)) || bytes.EqualFold(key, []byte(`"usage"`)) || bytes.EqualFold(key, []byte(`"error"`)) {
				return d, false
			}
			if !p.skip(0) {
				return d, false
			}
		}
	}
	p.ws()
	return d, sawChoices && p.i == len(p.b)
}

// member moves to the next member of the object being scanned (the opening
// brace already consumed) and returns its quoted key, positioned at the
// value; done at the closing brace.
func (p *scanner) member(first bool) (key []byte, done, ok bool) {
	p.ws()
	if p.lit('}') {
		return nil, true, true
	}
	if !first {
		if !p.lit(',') {
			return nil, false, false
		}
		p.ws()
	}
	key, ok = p.str()
	if !ok {
		return nil, false, false
	}
	p.ws()
	if !p.lit(':') {
		return nil, false, false
	}
	p.ws()
	return key, false, true
}

type scanner struct {
	b []byte
	i int
}

func (p *scanner) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *scanner) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *scanner) lit(c byte) bool {
	if p.peek() == c {
		p.i++
		return true
	}
	return false
}

func (p *scanner) word(w string) bool {
	if len(p.b)-p.i >= len(w) && string(p.b[p.i:p.i+len(w)]) == w {
		p.i += len(w)
		return true
	}
	return false
}

func (p *scanner) null() bool { return p.word("null") }

// str scans a string literal and returns it with its quotes. Control
// characters and bad escapes are rejected.
func (p *scanner) str() ([]byte, bool) {
	start := p.i
	if !p.lit('"') {
		return nil, false
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return p.b[start:p.i], true
		case c == '\\':
			if p.i+1 >= len(p.b) {
				return nil, false
			}
			switch p.b[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if p.i+6 > len(p.b) {
					return nil, false
				}
				for _, h := range p.b[p.i+2 : p.i+6] {
					if !isHex(h) {
						return nil, false
					}
				}
				p.i += 6
			default:
				return nil, false
			}
		case c < 0x20:
			return nil, false
		default:
			p.i++
		}
	}
	return nil, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// strOrNull scans a string literal or null (nil).
func (p *scanner) strOrNull() ([]byte, bool) {
	if p.null() {
		return nil, true
	}
	return p.str()
}

// skip scans any JSON value.
func (p *scanner) skip(depth int) bool {
	if depth > 64 {
		return false
	}
	switch c := p.peek(); {
	case c == '"':
		_, ok := p.str()
		return ok
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		p.i++
		p.ws()
		if p.lit(end) {
			return true
		}
		for {
			p.ws()
			if c == '{' {
				if _, ok := p.str(); !ok {
					return false
				}
				p.ws()
				if !p.lit(':') {
					return false
				}
				p.ws()
			}
			if !p.skip(depth + 1) {
				return false
			}
			p.ws()
			if p.lit(end) {
				return true
			}
			if !p.lit(',') {
				return false
			}
		}
	case c == 't':
		return p.word("true")
	case c == 'f':
		return p.word("false")
	case c == 'n':
		return p.null()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return false
}

func (p *scanner) number() bool {
	start := p.i
	p.lit('-')
	switch {
	case p.lit('0'):
	case p.peek() >= '1' && p.peek() <= '9':
		for p.peek() >= '0' && p.peek() <= '9' {
			p.i++
		}
	default:
		return false
	}
	if p.lit('.') {
		n := 0
		for p.peek() >= '0' && p.peek() <= '9' {
			p.i++
			n++
		}
		if n == 0 {
			return false
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.i++
		if c := p.peek(); c == '+' || c == '-' {
			p.i++
		}
		n := 0
		for p.peek() >= '0' && p.peek() <= '9' {
			p.i++
			n++
		}
		if n == 0 {
			return false
		}
	}
	return p.i > start
}

// choices accepts exactly one choice with index 0, a text-only delta and
// a finish_reason that is null or an escape-free string.
func (p *scanner) choices(d *fastDelta) bool {
	if !p.lit('[') {
		return false
	}
	p.ws()
	if !p.lit('{') {
		return false
	}
	sawDelta, sawIndex, sawFinish := false, false, false
	for first := true; ; first = false {
		key, done, ok := p.member(first)
		if !ok {
			return false
		}
		if done {
			break
		}
		switch string(key) {
		case `"index"`:
			if sawIndex || !p.word("0") || !p.endOfNumber() {
				return false
			}
			sawIndex = true
		case `"finish_reason"`:
			if sawFinish {
				return false // a duplicate key: let the full decoder decide
			}
			sawFinish = true
			if p.null() {
				continue
			}
			var ok bool
			if d.finish, ok = p.finishReason(); !ok {
				return false
			}
		case `"logprobs"`:
			if !p.null() {
				return false
			}
		case `"delta"`:
			if sawDelta || !p.delta(d) {
				return false
			}
			sawDelta = true
		default:
			return false
		}
	}
	p.ws()
	return sawDelta && p.lit(']')
}

// endOfNumber reports whether the number just scanned cannot continue.
func (p *scanner) endOfNumber() bool {
	c := p.peek()
	return !(c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E')
}

// delta accepts a delta with only text fields, role and a null refusal.
func (p *scanner) delta(d *fastDelta) bool {
	if !p.lit('{') {
		return false
	}
	seen := 0
	for first := true; ; first = false {
		key, done, ok := p.member(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		var dst *[]byte
		var bit int
		switch string(key) {
		case `"content"`:
			dst, bit = &d.content, 1
		case `"reasoning_content"`:
			dst, bit = &d.reasoningContent, 2
		case `"reasoning"`:
			dst, bit = &d.reasoning, 4
		case `"role"`:
			if _, ok := p.str(); !ok {
				return false
			}
			continue
		case `"refusal"`:
			if !p.null() {
				return false
			}
			continue
		case `"tool_calls"`:
			if d.tool || !p.toolCalls(d) {
				return false
			}
			continue
		default:
			return false
		}
		if seen&bit != 0 {
			return false // a duplicate key: let the full decoder decide
		}
		seen |= bit
		v, ok := p.strOrNull()
		if !ok {
			return false
		}
		*dst = v
	}
}

// reasoningText mirrors delta.reasoning: reasoning_content unless absent or
// null, else reasoning.
func (d fastDelta) reasoningText() []byte {
	if len(d.reasoningContent) > 0 {
		return d.reasoningContent
	}
	return d.reasoning
}

// toolCalls accepts an array of exactly one tool call: index (a small
// non-negative integer), optional id, type "function", and function with
// an optional name and arguments. Strings other than the arguments must be
// escape-free (they are used as they are). Every key at most once.
func (p *scanner) toolCalls(d *fastDelta) bool {
	if !p.lit('[') {
		return false
	}
	p.ws()
	seen := 0
	ok := p.object(func(key []byte) (int, bool) {
		var ok bool
		switch string(key) {
		case `"index"`:
			d.toolIndex, ok = p.smallInt()
			return 1, ok
		case `"id"`:
			d.toolID, ok = p.plainStr()
			return 2, ok
		case `"type"`:
			return 4, p.word(`"function"`)
		case `"function"`:
			return 8, p.object(func(key []byte) (int, bool) {
				switch string(key) {
				case `"name"`:
					d.toolName, ok = p.plainStr()
					return 16, ok
				case `"arguments"`:
					d.args, ok = p.strOrNull()
					return 32, ok
				}
				return 0, false
			}, &seen)
		}
		return 0, false
	}, &seen)
	p.ws()
	d.tool = true
	return ok && seen&1 != 0 && p.lit(']')
}

// object scans an object, calling value at each member (positioned at its
// value) with its quoted key; value scans the value and returns the key's
// bit in *seen (a repeated bit fails) and whether the value was accepted.
func (p *scanner) object(value func(key []byte) (bit int, ok bool), seen *int) bool {
	if !p.lit('{') {
		return false
	}
	for first := true; ; first = false {
		key, done, ok := p.member(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		bit, ok := value(key)
		if !ok || *seen&bit != 0 {
			return false
		}
		*seen |= bit
	}
}

// plainStr scans a string literal without escapes, valid UTF-8 (what the
// full decoder would repair), and returns its text.
func (p *scanner) plainStr() (string, bool) {
	v, ok := p.str()
	if !ok || bytes.IndexByte(v, '\\') >= 0 || !utf8.Valid(v) {
		return "", false
	}
	return string(v[1 : len(v)-1]), true
}

// finishReason scans a finish reason as plainStr does, the usual ones
// without an allocation.
func (p *scanner) finishReason() (string, bool) {
	for _, q := range [...]string{`"stop"`, `"tool_calls"`, `"length"`} {
		if p.word(q) {
			return q[1 : len(q)-1], true
		}
	}
	return p.plainStr()
}

// smallInt scans a non-negative integer below 1<<20 without fraction or
// exponent.
func (p *scanner) smallInt() (int, bool) {
	start, n := p.i, 0
	for p.peek() >= '0' && p.peek() <= '9' {
		n = n*10 + int(p.b[p.i]-'0')
		p.i++
		if n >= 1<<20 {
			return 0, false
		}
	}
	if p.i == start || (p.i-start > 1 && p.b[start] == '0') || !p.endOfNumber() {
		return 0, false
	}
	return n, true
}
