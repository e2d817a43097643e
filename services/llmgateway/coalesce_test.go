package llmgateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

// toolCallSSE is a chat-completions stream of one tool call whose
// arguments arrive in piece-byte deltas, as real SSE bytes.
func toolCallSSE(args string, piece int) []byte {
	var b strings.Builder
	b.WriteString(`data: {"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write","arguments":""}}]}}]}` + "\n\n")
	for i := 0; i < len(args); i += piece {
		// JSON-escaped, a multi-byte character cut between deltas as raw
		// bytes (what fragment reassembles).
		q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(args[i:min(i+piece, len(args))]) + `"`
		fmt.Fprintf(&b, `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}}]}`+"\n\n", q)
	}
	b.WriteString(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n")
	return []byte(b.String())
}

// textSSEOf is a chat-completions text stream of n deltas.
func textSSEOf(n int) ([]byte, string) {
	var b, want strings.Builder
	for i := range n {
		d := fmt.Sprintf("tok%d ", i)
		want.WriteString(d)
		fmt.Fprintf(&b, `data: {"choices":[{"index":0,"delta":{"content":%q}}]}`+"\n\n", d)
	}
	b.WriteString(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	return []byte(b.String()), want.String()
}

// TestCoalescedOverGRPC: through the real gRPC server and a fake upstream
// writing real SSE bytes, deltas that arrive together leave as one
// message, a 1.2 MB argument in 12-byte deltas stays a few hundred
// messages however the bytes are cut, and the assembled message is byte
// for byte the one the provider sent.
func TestCoalescedOverGRPC(t *testing.T) {
	t.Parallel()
	// 1.2 MB; a sixth of it under the race detector, which is slow on
	// 100,000 events (the bound is the same shape: ≤ 600 either way).
	args := `{"path":"big.txt","content":"` + strings.Repeat(`line é\u00e9 \"q\"\n`, 60_000/raceDivisor) + `"}`
	huge := toolCallSSE(args, 12)
	text, wantText := textSSEOf(2000)
	for _, tt := range []struct {
		name      string
		reply     providertest.Reply
		maxChunks int
		check     func(t *testing.T, blocks []*llmv1.ContentBlock)
	}{
		{"2000 text deltas in one write", providertest.Reply{Body: text}, 200, func(t *testing.T, b []*llmv1.ContentBlock) {
			if got := b[0].GetText().GetText(); got != wantText {
				t.Errorf("text differs: %d bytes, want %d", len(got), len(wantText))
			}
		}},
		{"2000 text deltas in 97-byte writes", providertest.Reply{Body: text, Chunk: 97}, 1000, func(t *testing.T, b []*llmv1.ContentBlock) {
			if got := b[0].GetText().GetText(); got != wantText {
				t.Errorf("text differs: %d bytes, want %d", len(got), len(wantText))
			}
		}},
		{"1.2 MB argument in 12-byte deltas, 131-byte writes", providertest.Reply{Body: huge, Chunk: 131}, 600, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := providertest.Serve(t, tt.reply)
			c := startGateway(t, Config{Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: up.URL}}})
			chunks := generate(t, c, &llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("go")}})
			// Assemble from the deltas alone (block-ends dropped), so the
			// check is on what a watcher of the deltas saw.
			var a llmstream.Assembler
			for _, ch := range chunks {
				if ch.GetBlockEnd() == nil {
					a.Push(ch)
				}
			}
			blocks, err := a.Blocks()
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, blocks)
			} else if got := blocks[0].GetToolCall().GetArguments(); got != args || blocks[0].GetToolCall().GetName() != "write" {
				t.Errorf("arguments differ: %d bytes, want %d (name %q)", len(got), len(args), blocks[0].GetToolCall().GetName())
			}
			if len(chunks) > tt.maxChunks {
				t.Errorf("%d messages, want ≤ %d", len(chunks), tt.maxChunks)
			}
			t.Logf("%d messages", len(chunks))
		})
	}
}

// TestHeldTailLeavesWhenProviderIsQuiet: a small delta after a long block
// is held back by the growth bound, but when the provider then goes quiet
// the tail still reaches the client (after provider.MaxHold), before the
// provider says anything more: the stream stays live for watchers.
func TestHeldTailLeavesWhenProviderIsQuiet(t *testing.T) {
	t.Parallel()
	head, _ := textSSEOf(1500) // ~12 KB of text
	tail := `data: {"choices":[{"index":0,"delta":{"content":"tail"}}]}` + "\n\n"
	_, wantHead := textSSEOf(1500)
	want := wantHead + "tail"
	headEvents := head[:bytes.LastIndex(head, []byte("data: {\"choices\":[{\"index\":0,\"delta\":{},"))]
	got := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		_, _ = w.Write(headEvents)
		fl.Flush()
		_, _ = io.WriteString(w, tail)
		fl.Flush()
		select { // quiet until the client has every byte, tail included
		case <-got:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	c := startGateway(t, Config{IdleTimeout: 20 * time.Second, Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: srv.URL}}})
	var text strings.Builder
	s, err := c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("go")}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := s.Recv()
		if err != nil {
			t.Fatalf("%v after %d bytes", err, text.Len())
		}
		text.WriteString(r.GetChunk().GetTextDelta().GetText())
		if text.String() == want {
			close(got)
			break
		}
		if f := r.GetChunk().GetFinish(); f != nil {
			t.Fatalf("finished before the tail arrived: %v (%d bytes)", f, text.Len())
		}
	}
	chunks, err := recvAll(t, s)
	if err != nil || providertest.Finish(chunks).GetReason().GetStop() == nil {
		t.Fatalf("end of stream: %v %v", err, providertest.Format(chunks))
	}
}
