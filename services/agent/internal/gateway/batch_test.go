package gateway

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// TestBatchedResponses: whatever way the gateway groups a stream's chunks
// into responses (one per response as a gateway that predates batches
// sends them, or batches of any sizes), the client yields the very same
// chunks in the same order, each once; every request asks for batches,
// with and without a session (the two encodings of the codec).
func TestBatchedResponses(t *testing.T) {
	t.Parallel()
	script := fakes.ToolCalls("let me look", fakes.Call{ID: "c1", Name: "read", Args: `{"path":"a"}`}, fakes.Call{ID: "c2", Name: "ls", Args: `{}`})
	gw := &fakes.Gateway{}
	c := dialGateway(t, fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }))
	for _, tt := range []struct {
		name    string
		batches []int
	}{
		{"one per response (a gateway that predates batches)", nil},
		{"all in one", []int{len(script)}},
		{"mixed sizes", []int{2, 1, 4, 3}},
		{"batches, then singles", []int{5}},
		{"even batches", []int{3, 3, 3, 3}},
	} {
		for _, session := range []string{"", "s-1"} {
			gw.Script(fakes.Response{Chunks: script, Batches: tt.batches})
			var got []*llmv1.StreamChunk
			for ch, err := range c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "fake", Model: "m", SessionId: session,
				Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER}}}) {
				if err != nil {
					t.Fatalf("%s (session %q): %v", tt.name, session, err)
				}
				got = append(got, ch)
			}
			if len(got) != len(script) {
				t.Fatalf("%s (session %q): %d chunks, want %d", tt.name, session, len(got), len(script))
			}
			for i := range script {
				if !proto.Equal(got[i], script[i]) {
					t.Fatalf("%s (session %q): chunk %d = %v, want %v", tt.name, session, i, got[i], script[i])
				}
			}
			reqs := gw.Requests()
			if last := reqs[len(reqs)-1]; !last.GetBatchChunks() {
				t.Errorf("%s (session %q): the request did not ask for batches", tt.name, session)
			}
		}
	}
}

// TestBatchEnds: a consumer that stops inside a batch gets nothing more
// (the iterator contract); a stream that ends after a batch without its
// finish yields the batch's chunks, then STREAM_CLOSED.
func TestBatchEnds(t *testing.T) {
	t.Parallel()
	script := fakes.Text("hello")
	gw := &fakes.Gateway{}
	c := dialGateway(t, fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }))
	req := &llmv1.GenerateRequest{Provider: "fake", Model: "m", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER}}}

	gw.Script(fakes.Response{Chunks: script, Batches: []int{len(script)}})
	n := 0
	for _, err := range c.Generate(t.Context(), req) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 2 {
			break
		}
	}

	gw.Script(fakes.Response{Chunks: script[:3], Batches: []int{3}})
	var got []string
	for ch, err := range c.Generate(t.Context(), req) {
		var rf *loop.RequestFailure
		switch {
		case errors.As(err, &rf):
			got = append(got, rf.Failure.GetCode())
		case err != nil:
			t.Fatal(err)
		default:
			got = append(got, fmt.Sprintf("%T", ch.GetChunk()))
		}
	}
	want := []string{"*llmv1.StreamChunk_BlockStart", "*llmv1.StreamChunk_TextDelta", "*llmv1.StreamChunk_BlockEnd", "STREAM_CLOSED"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
