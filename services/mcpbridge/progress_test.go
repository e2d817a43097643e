package mcpbridge

import (
	"bytes"
	"io"
	"testing"
)

// countTaps reads body through an sseTap in chunks of the given sizes and
// returns how many progress notifications for token "t" it counted.
func countTaps(body []byte, sizes []byte) int {
	b := &Bridge{}
	_, sink := b.registerProgressToken("t")
	tap := &sseTap{ReadCloser: io.NopCloser(bytes.NewReader(body)), b: b}
	for i := 0; ; i++ {
		n := 1
		if len(sizes) > 0 {
			n = int(sizes[i%len(sizes)])%17 + 1
		}
		buf := make([]byte, n)
		if _, err := tap.Read(buf); err != nil {
			break
		}
	}
	return sink.seen
}

const sseBody = "event: message\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":1,\"message\":\"a\"}}\r\n\r\n" +
	"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"other\",\"progress\":1}}\n\n" +
	"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\n" +
	"data:  \"params\":{\"progressToken\":\"t\",\"progress\":2}}\n\n" +
	": comment\n\n" +
	"data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[]}}\n\n"

func TestSSETapCountsProgress(t *testing.T) {
	t.Parallel()
	for _, sizes := range [][]byte{nil, {0}, {3}, {16}, {1, 7, 2}} {
		if got := countTaps([]byte(sseBody), sizes); got != 2 {
			t.Errorf("chunks %v: counted %d progress notifications for t, want 2", sizes, got)
		}
	}
}

// FuzzSSETap: the count never depends on how the body is chunked, and the
// scanner never panics.
func FuzzSSETap(f *testing.F) {
	f.Add([]byte(sseBody), []byte{1})
	f.Add([]byte("data: {\n\n"), []byte{5})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, body, sizes []byte) {
		whole := countTaps(body, []byte{255})
		if got := countTaps(body, sizes); got != whole {
			t.Fatalf("chunked count %d != whole-body count %d", got, whole)
		}
	})
}
