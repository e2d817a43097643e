package agent_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// TestDropEndsFollowers: a replica that lost a session's lease drops it
// (Service.Drop) in the middle of a turn. A client following the session's
// events on that replica must not wait for events that will never come
// (the new owner appends them elsewhere): its stream ends at once with
// UNAVAILABLE, so it calls again and reaches the new owner. Before the
// fix the stream stayed open on the dropped session until the client's
// own deadline.
func TestDropEndsFollowers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	gw := &fakes.Gateway{Default: func(*llmv1.GenerateRequest) fakes.Response {
		return fakes.Response{Wait: release, Chunks: fakes.Text("never seen")}
	}}
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	ctx := t.Context()
	svc, closeAll := sqliteService(t, ctx, filepath.Join(t.TempDir(), "sessions.db"), gwAddr)
	defer closeAll()
	addr := fakes.Serve(t, svc.Register)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := agentv1.NewAgentServiceClient(conn)

	if _, err := client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "d", Cwd: "/work",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Send(ctx, &agentv1.SendRequest{SessionId: "d", Content: []*llmv1.ContentBlock{session.Text("hi")}}); err != nil {
		t.Fatal(err)
	}
	// The follower's own deadline is far beyond the wait below.
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stream, err := client.StreamEvents(fctx, &agentv1.StreamEventsRequest{SessionId: "d"})
	if err != nil {
		t.Fatal(err)
	}
	for { // follow until the turn waits for the model
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("following the turn: %v", err)
		}
		if session.TypeName(resp.GetEvent()) == session.TypeUserMessage {
			break
		}
	}
	if !svc.Drop(ctx, "d") {
		t.Fatal("Drop found no live session")
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("the follower of a dropped session ended with %v, want UNAVAILABLE", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower of a dropped session is still waiting 10 s after the drop")
	}
}
