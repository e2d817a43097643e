package sse

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

type ev struct{ Type, Data string }

func readAll(t testing.TB, r io.Reader) ([]ev, error) {
	t.Helper()
	sr := NewReaderSize(r, 1<<10)
	var out []ev
	for {
		e, err := sr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, ev{e.Type, string(e.Data)})
	}
}

func TestReader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []ev
	}{
		{"single", "data: hi\n\n", []ev{{"", "hi"}}},
		{"no space", "data:hi\n\n", []ev{{"", "hi"}}},
		{"two spaces keeps one", "data:  hi\n\n", []ev{{"", " hi"}}},
		{"multi line", "data: a\ndata: b\n\n", []ev{{"", "a\nb"}}},
		{"crlf", "event: x\r\ndata: a\r\n\r\ndata: b\r\n\r\n", []ev{{"x", "a"}, {"", "b"}}},
		{"cr only", "data: a\r\rdata: b\r\r", []ev{{"", "a"}, {"", "b"}}},
		{"comments and ids", ": ping\nid: 7\nretry: 10\ndata: a\n\n", []ev{{"", "a"}}},
		{"blank lines without data", "\n\n\nevent: lonely\n\ndata: a\n\n", []ev{{"", "a"}}},
		{"unterminated final event", "data: a\n\ndata: [DONE]", []ev{{"", "a"}, {"", "[DONE]"}}},
		{"field without colon", "data\n\n", []ev{{"", ""}}},
		{"unknown field ignored", "foo: bar\ndata: x\n\n", []ev{{"", "x"}}},
		{"anthropic", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", []ev{{"message_stop", `{"type":"message_stop"}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, r := range []io.Reader{strings.NewReader(tt.in), iotest.OneByteReader(strings.NewReader(tt.in))} {
				got, err := readAll(t, r)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestReaderTooLarge(t *testing.T) {
	t.Parallel()
	_, err := readAll(t, strings.NewReader("data: "+strings.Repeat("x", 4<<10)+"\n\n"))
	if !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("err = %v, want ErrEventTooLarge", err)
	}
	_, err = readAll(t, strings.NewReader(strings.Repeat("data: 0123456789\n", 200)+"\n"))
	if !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("multi-line err = %v, want ErrEventTooLarge", err)
	}
}

func TestReaderReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom))
	got, err := readAll(t, r)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if diff := cmp.Diff([]ev{{"", "a"}}, got); diff != "" {
		t.Errorf("events before the error (-want +got):\n%s", diff)
	}
}

// reference is a deliberately naive implementation of the same grammar.
func reference(in string) []ev {
	in = strings.ReplaceAll(in, "\r\n", "\n")
	in = strings.ReplaceAll(in, "\r", "\n")
	var out []ev
	var data []string
	typ := ""
	has := false
	lines := strings.Split(in, "\n")
	for i, line := range lines {
		if i == len(lines)-1 && line == "" {
			break
		}
		if line == "" {
			if has {
				out = append(out, ev{typ, strings.Join(data, "\n")})
			}
			data, typ, has = nil, "", false
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			data = append(data, value)
			has = true
		case "event":
			typ = value
		}
	}
	if has {
		out = append(out, ev{typ, strings.Join(data, "\n")})
	}
	return out
}

func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"data: hi\n\n", "event: x\r\ndata: a\r\n\r\n", "data: a\rdata: b\r\r", ": c\ndata\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"\\u00e9\"}}]}\n\ndata: [DONE]\n\n",
		"data: a\n\ndata: [DONE]", "\r\n\r\n", "data:\n\n", "event: e\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := readAll(t, bytes.NewReader(in))
		if err != nil {
			if errors.Is(err, ErrEventTooLarge) {
				return
			}
			t.Fatalf("unexpected error %v", err)
		}
		want := reference(string(in))
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b []ev) bool {
			return cmp.Equal(a, b) || (len(a) == 0 && len(b) == 0)
		})); diff != "" {
			t.Fatalf("events differ from the reference (-want +got):\n%s", diff)
		}
	})
}

func BenchmarkReader(b *testing.B) {
	chunk := "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"}}]}\n\n"
	in := []byte(strings.Repeat(chunk, 1000))
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		r := NewReader(bytes.NewReader(in))
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
	}
}

// TestRelease: a released reader reports ErrReleased, and a reader that
// reuses its buffer reads only its own stream (nothing left over from the
// released one, which had unread bytes buffered).
func TestRelease(t *testing.T) {
	for range 3 {
		r := NewReader(strings.NewReader("data: one\n\ndata: left over\n\n"))
		if ev, err := r.Next(); err != nil || string(ev.Data) != "one" {
			t.Fatalf("Next = %q, %v", ev.Data, err)
		}
		r.Release()
		r.Release() // twice is harmless
		if _, err := r.Next(); !errors.Is(err, ErrReleased) {
			t.Fatalf("Next after Release = %v, want ErrReleased", err)
		}
		r2 := NewReader(strings.NewReader("data: two\n\n"))
		if ev, err := r2.Next(); err != nil || string(ev.Data) != "two" {
			t.Fatalf("a reader after a release: Next = %q, %v", ev.Data, err)
		}
		if _, err := r2.Next(); !errors.Is(err, io.EOF) {
			t.Fatalf("a reader after a release: second Next = %v, want EOF", err)
		}
		r2.Release()
	}
}
