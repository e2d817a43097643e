// Package fragment reassembles streamed text whose characters may be split
// across provider chunks: a multi-byte UTF-8 sequence cut between two JSON
// strings, or a UTF-16 surrogate pair cut between two "\uXXXX" escapes.
// encoding/json would turn each half into U+FFFD; Unquote keeps the raw
// bytes and a Carry holds an incomplete tail back until the next fragment
// completes it, so every emitted delta is valid UTF-8 and the concatenation
// equals what the model produced.
package fragment

import (
	"errors"
	"unicode/utf8"
)

// ErrSyntax reports a malformed JSON string literal.
var ErrSyntax = errors.New("fragment: malformed JSON string")

// Unquote appends the contents of the JSON string literal raw (with its
// quotes) to dst. Raw bytes pass through unchanged even when they are not
// valid UTF-8; a lone surrogate escape is encoded as its 3-byte (CESU-8)
// form so a Carry can pair it with its other half. "null" and an absent
// (empty) value decode to nothing.
func Unquote(dst, raw []byte) ([]byte, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return dst, nil
	}
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return dst, ErrSyntax
	}
	s := raw[1 : len(raw)-1]
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		if i+1 >= len(s) {
			return dst, ErrSyntax
		}
		switch s[i+1] {
		case '"', '\\', '/':
			dst = append(dst, s[i+1])
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			if i+6 > len(s) {
				return dst, ErrSyntax
			}
			r, ok := hex4(s[i+2 : i+6])
			if !ok {
				return dst, ErrSyntax
			}
			if r >= 0xD800 && r <= 0xDFFF {
				dst = append(dst, 0xED, byte(0x80|(r>>6)&0x3F), byte(0x80|r&0x3F))
			} else {
				dst = utf8.AppendRune(dst, r)
			}
			i += 6
			continue
		default:
			return dst, ErrSyntax
		}
		i += 2
	}
	return dst, nil
}

func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// Carry holds the incomplete tail of one block's text between fragments.
// The zero value is ready.
type Carry struct {
	tail []byte
	buf  []byte
}

// Push appends a decoded fragment and returns the longest valid UTF-8 text
// that is complete so far. Bytes that can never become valid become U+FFFD.
func (c *Carry) Push(frag []byte) string {
	if len(c.tail) == 0 && utf8.Valid(frag) && !hasSurrogate(frag) {
		return string(frag) // the common case: one allocation
	}
	c.buf = append(append(c.buf[:0], c.tail...), frag...)
	out, rest := fix(c.buf, false)
	c.tail = append(c.tail[:0], rest...)
	return out
}

// Flush returns whatever is held back, made valid.
func (c *Carry) Flush() string {
	if len(c.tail) == 0 {
		return ""
	}
	out, _ := fix(c.tail, true)
	c.tail = c.tail[:0]
	return out
}

// Pending reports whether bytes are held back.
func (c *Carry) Pending() bool { return len(c.tail) > 0 }

func hasSurrogate(b []byte) bool {
	for i := 0; i+1 < len(b); i++ {
		if b[i] == 0xED && b[i+1] >= 0xA0 {
			return true
		}
	}
	return false
}

// fix converts b to valid UTF-8, pairing CESU-8 surrogates; unless final, an
// incomplete sequence at the end is returned as rest. A run of invalid bytes
// becomes one U+FFFD, as with strings.ToValidUTF8.
func fix(b []byte, final bool) (string, []byte) {
	out := make([]byte, 0, len(b))
	bad := false
	invalid := func() {
		if !bad {
			out = utf8.AppendRune(out, utf8.RuneError)
		}
		bad = true
	}
	for i := 0; i < len(b); {
		wasBad := bad
		bad = false
		if b[i] < utf8.RuneSelf {
			out = append(out, b[i])
			i++
			continue
		}
		if b[i] == 0xED && i+1 < len(b) && b[i+1] >= 0xA0 && b[i+1] <= 0xBF {
			// A surrogate half in CESU-8 form.
			if i+3 > len(b) {
				if !final {
					return string(out), b[i:]
				}
				bad = wasBad
				invalid()
				break
			}
			hi := rune(b[i+1]&0x3F)<<6 | rune(b[i+2]&0x3F) | 0xD000
			if hi < 0xDC00 { // high half: needs a low half next
				if i+3 == len(b) && !final {
					return string(out), b[i:]
				}
				if i+6 <= len(b) && b[i+3] == 0xED && b[i+4] >= 0xB0 && b[i+4] <= 0xBF {
					lo := rune(b[i+4]&0x3F)<<6 | rune(b[i+5]&0x3F) | 0xD000
					out = utf8.AppendRune(out, 0x10000+(hi-0xD800)<<10+(lo-0xDC00))
					i += 6
					continue
				}
				if i+6 > len(b) && !final && b[i+3] == 0xED {
					return string(out), b[i:]
				}
			}
			bad = wasBad
			invalid()
			i += 3
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			if !final && !utf8.FullRune(b[i:]) {
				return string(out), b[i:]
			}
			bad = wasBad
			invalid()
			i++
			continue
		}
		out = append(out, b[i:i+n]...)
		i += n
	}
	return string(out), nil
}
