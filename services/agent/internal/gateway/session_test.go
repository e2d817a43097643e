package gateway

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
)

// TestSessionHeader: a Generate call of a session carries the session id in
// SessionHeader (what the agent's session-affine connection hashes); a
// call without a session carries none (any replica).
func TestSessionHeader(t *testing.T) {
	t.Parallel()
	got := make(chan []string, 1)
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		got <- md.Get(SessionHeader)
		return status.Error(codes.Unavailable, "recorded")
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpcserver.Dial(lis.Addr().String(), grpcserver.SessionAffinity(SessionHeader))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := New(conn)
	for _, tc := range []struct {
		session string
		want    []string
	}{{"s-1", []string{"s-1"}}, {"", nil}} {
		for _, err := range c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: tc.session}) {
			if err == nil {
				t.Fatalf("session %q: a chunk from a server that answers none", tc.session)
			}
		}
		if h := <-got; len(h) != len(tc.want) || (len(h) == 1 && h[0] != tc.want[0]) {
			t.Errorf("session %q: %s %q, want %q", tc.session, SessionHeader, h, tc.want)
		}
	}
}
