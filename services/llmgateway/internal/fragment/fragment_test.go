package fragment

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCarry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		frags []string // JSON string literals as they appear on the wire
		want  string
	}{
		{"plain", []string{`"ab"`, `"c"`}, "abc"},
		{"escapes", []string{`"a\n\"\\\/\t"`}, "a\n\"\\/\t"},
		{"utf8 split", []string{"\"caf\xc3\"", "\"\xa9!\""}, "café!"},
		{"4-byte split thrice", []string{"\"\xf0\x9f\"", "\"\x98\"", "\"\x80\""}, "😀"},
		{"surrogate pair split", []string{`"x\ud83d"`, `"\ude00y"`}, "x😀y"},
		{"surrogate pair whole", []string{`"\ud83d\ude00"`}, "😀"},
		{"lone high surrogate", []string{`"\ud83d"`, `"z"`}, "\uFFFDz"},
		{"lone low surrogate", []string{`"\ude00"`}, "\uFFFD"},
		{"invalid byte", []string{"\"a\xffb\""}, "a\uFFFDb"},
		{"dangling at end", []string{"\"a\xc3\""}, "a\uFFFD"},
		{"null", []string{`null`, `"a"`}, "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c Carry
			var sb strings.Builder
			for _, f := range tt.frags {
				b, err := Unquote(nil, []byte(f))
				if err != nil {
					t.Fatalf("Unquote(%q): %v", f, err)
				}
				out := c.Push(b)
				if !utf8.ValidString(out) {
					t.Fatalf("Push emitted invalid UTF-8 %q", out)
				}
				sb.WriteString(out)
			}
			sb.WriteString(c.Flush())
			if got := sb.String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestUnquoteSyntax(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`"a`, `a"`, `"\x"`, `"\u12"`, `"\u12zz"`, `"\"`} {
		if _, err := Unquote(nil, []byte(in)); err == nil {
			t.Errorf("Unquote(%q) succeeded", in)
		}
	}
}

func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"a\u00e9\ud83d\ude00\n"`, `"x"`, `"\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, _ := json.Marshal(s)
		got, err := Unquote(nil, raw)
		if err != nil {
			t.Fatalf("Unquote(%s): %v", raw, err)
		}
		var c Carry
		out := c.Push(got) + c.Flush()
		if want := strings.ToValidUTF8(s, "\uFFFD"); utf8.ValidString(s) && out != want {
			t.Fatalf("round trip of %q gave %q", s, out)
		}
		if !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 %q", out)
		}
	})
}

// quoteRaw builds a JSON string literal that keeps non-ASCII bytes raw, as
// a provider that cut a character in two would send it.
func quoteRaw(b []byte) []byte {
	out := []byte{'"'}
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c < 0x20:
			out = append(out, fmt.Sprintf(`\u%04x`, c)...)
		default:
			out = append(out, c)
		}
	}
	return append(out, '"')
}

// FuzzSplit: any valid text cut at any byte positions reassembles exactly,
// and every emitted piece is valid UTF-8.
func FuzzSplit(f *testing.F) {
	f.Add("café ☕ 😀 \"q\" \\", uint8(4), uint8(9))
	f.Add("😀😀", uint8(1), uint8(6))
	f.Fuzz(func(t *testing.T, s string, a, b uint8) {
		if !utf8.ValidString(s) {
			return
		}
		cuts := []int{int(a) % (len(s) + 1), int(b) % (len(s) + 1)}
		if cuts[0] > cuts[1] {
			cuts[0], cuts[1] = cuts[1], cuts[0]
		}
		parts := []string{s[:cuts[0]], s[cuts[0]:cuts[1]], s[cuts[1]:]}
		var c Carry
		var sb strings.Builder
		for _, p := range parts {
			dec, err := Unquote(nil, quoteRaw([]byte(p)))
			if err != nil {
				t.Fatal(err)
			}
			out := c.Push(dec)
			if !utf8.ValidString(out) {
				t.Fatalf("invalid piece %q", out)
			}
			sb.WriteString(out)
		}
		sb.WriteString(c.Flush())
		if sb.String() != s {
			t.Fatalf("reassembled %q, want %q", sb.String(), s)
		}
	})
}
