package llmgateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

// recvMsgs streams req and returns every response message as received.
func recvMsgs(t testing.TB, ctx context.Context, c llmv1.LlmGatewayClient, req *llmv1.GenerateRequest) []*llmv1.GenerateResponse {
	t.Helper()
	s, err := c.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out []*llmv1.GenerateResponse
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
}

// flatten is the chunk sequence the responses carry (chunk, then chunks).
func flatten(rs []*llmv1.GenerateResponse) []*llmv1.StreamChunk {
	var out []*llmv1.StreamChunk
	for _, r := range rs {
		out = appendChunks(out, r)
	}
	return out
}

// appendChunks appends the chunks r carries, as a receiver takes them:
// `chunk` when set, then each of `chunks`.
func appendChunks(out []*llmv1.StreamChunk, r *llmv1.GenerateResponse) []*llmv1.StreamChunk {
	if c := r.GetChunk(); c != nil {
		out = append(out, c)
	}
	return append(out, r.GetChunks()...)
}

// checkBatches fails unless every response is either one chunk in
// `chunk` or a batch of at least two in `chunks` (never both), within
// MaxBatchBytes; it returns how many responses were batches.
func checkBatches(t testing.TB, rs []*llmv1.GenerateResponse) (batches int) {
	t.Helper()
	for i, r := range rs {
		switch {
		case len(r.GetChunks()) == 0 && r.GetChunk() == nil:
			t.Fatalf("response %d carries no chunk", i)
		case len(r.GetChunks()) == 0:
		case r.GetChunk() != nil:
			t.Fatalf("response %d carries chunk and chunks", i)
		case len(r.GetChunks()) == 1:
			t.Fatalf("response %d is a batch of one (a lone chunk goes in chunk)", i)
		default:
			batches++
			if n := proto.Size(&llmv1.GenerateResponse{Chunks: r.GetChunks()}); n > MaxBatchBytes {
				t.Fatalf("response %d: a batch of %d chunks is %d bytes, bound %d", i, len(r.GetChunks()), n, MaxBatchBytes)
			}
		}
	}
	return batches
}

func scriptOf(t testing.TB, steps ...map[string]any) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"steps": steps, "sequential": true})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBatchesOnlyWhenAsked: a request without batch_chunks (an agent that
// predates it) gets one chunk per response, always; with it the same
// chunks, in the same order, arrive in fewer responses, batches bounded
// in size. Table over the adapters that mark boundaries: the scripted one
// (its chunks without pauses are all waiting at once, a huge argument
// included) and an HTTP one whose provider sends its whole stream at once.
func TestBatchesOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat(`{"k":"0123456789"},`, 20_000) // 380 KB, 16-byte pieces
	step := map[string]any{"reasoning": "let me think about it", "text": "Here is the plan for today.",
		"tool_calls": []map[string]any{{"id": "c1", "name": "read", "arguments": map[string]any{"path": "a.txt"}}, {"id": "c2", "name": "write", "arguments": `{"x":[` + huge + `1]}`}}}
	var body strings.Builder
	for i := range 300 {
		body.WriteString(eventOf(i))
	}
	body.WriteString(streamEnd)
	up := providertest.Serve(t, providertest.Reply{Body: []byte(body.String())})
	c := startGateway(t, Config{Routes: []RouteConfig{
		{Name: "scripted", Kind: KindScripted, Script: scriptOf(t, step, step)},
		{Name: "http", Kind: KindOpenAI, BaseURL: up.URL},
	}})
	for _, tt := range []struct {
		route string
		// exact: the chunk cuts do not depend on the network's reads, so
		// batched and single streams are equal chunk for chunk.
		exact bool
	}{
		{"scripted", true},
		{"http", false},
	} {
		t.Run(tt.route, func(t *testing.T) {
			req := func(batch bool) *llmv1.GenerateRequest {
				return &llmv1.GenerateRequest{Provider: tt.route, Model: "m", Messages: []*llmv1.Message{userText("hi")}, BatchChunks: batch}
			}
			singles := recvMsgs(t, t.Context(), c, req(false))
			if n := checkBatches(t, singles); n != 0 {
				t.Fatalf("%d batches sent to a request that did not ask for them", n)
			}
			batched := recvMsgs(t, t.Context(), c, req(true))
			if checkBatches(t, batched) == 0 || len(batched) >= len(singles) {
				t.Fatalf("batched: %d responses with %d batches, singles %d responses", len(batched), checkBatches(t, batched), len(singles))
			}
			one, many := flatten(singles), flatten(batched)
			for _, s := range [][]*llmv1.StreamChunk{one, many} {
				if err := llmstream.CheckStream(s); err != nil {
					t.Fatal(err)
				}
			}
			if tt.exact {
				if len(one) != len(many) {
					t.Fatalf("%d chunks batched, %d single", len(many), len(one))
				}
				for i := range one {
					if !proto.Equal(one[i], many[i]) {
						t.Fatalf("chunk %d differs:\nsingle  %v\nbatched %v", i, one[i], many[i])
					}
				}
				if tt.route == "scripted" && len(batched) < 380_000/MaxBatchBytes {
					t.Errorf("a 380 KB argument came in %d responses: batches are not bounded", len(batched))
				}
			}
			var a, b llmstream.Assembler
			for _, c := range one {
				a.Push(c)
			}
			for _, c := range many {
				b.Push(c)
			}
			ma, _ := a.Message()
			mb, _ := b.Message()
			if !proto.Equal(ma, mb) {
				t.Fatalf("assembled messages differ:\nsingle  %v\nbatched %v", ma, mb)
			}
			t.Logf("%d chunks: %d responses single, %d batched", len(one), len(singles), len(batched))
		})
	}
}

// TestBatchedStreamStaysLive: with batches on, each provider event that
// arrives alone reaches the client before the provider sends the next (it
// sends the next only then): nothing is held back to wait for more.
func TestBatchedStreamStaysLive(t *testing.T) {
	t.Parallel()
	const n = 20
	up := newLockstepUpstream(t, n)
	c := startGateway(t, Config{Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: up.url}}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a held delta deadlocks: fail, not hang
	defer cancel()
	s, err := c.Generate(ctx, &llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("hi")}, BatchChunks: true})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after %q: %v", text.String(), err)
		}
		for _, ch := range flatten([]*llmv1.GenerateResponse{r}) {
			if d := ch.GetTextDelta(); d != nil {
				text.WriteString(d.GetText())
				up.next <- struct{}{}
			}
		}
	}
	if text.String() != wantText(n) {
		t.Fatalf("text %q, want %q", text.String(), wantText(n))
	}
}
