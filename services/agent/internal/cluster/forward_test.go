package cluster_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
)

// peer is a replica stand-in: it owns the sessions whose id starts with
// its name, answers the others with the owned-elsewhere status pointing at
// elsewhere, and reports in its answers the metadata and deadline it saw.
type peer struct {
	agentv1.UnimplementedAgentServiceServer
	name      string
	elsewhere string // address of the other replica
}

func (p *peer) owns(id string) error {
	if strings.HasPrefix(id, p.name) {
		return nil
	}
	return (&cluster.OwnedElsewhereError{SessionID: id, Owner: "other", Address: p.elsewhere}).Status().Err()
}

// seen encodes what the server saw: its name, the caller's x-caller
// metadata, whether the call was forwarded and whether it had a deadline.
func seen(ctx context.Context, name string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	dl := "no-deadline"
	if d, ok := ctx.Deadline(); ok && time.Until(d) > 0 && time.Until(d) <= 30*time.Second {
		dl = "deadline"
	}
	return strings.Join([]string{name, strings.Join(md.Get("x-caller"), ","), strings.Join(md.Get(cluster.ForwardedHeader), ","), dl}, "|")
}

func (p *peer) GetSession(ctx context.Context, req *agentv1.GetSessionRequest) (*agentv1.GetSessionResponse, error) {
	if err := p.owns(req.GetSessionId()); err != nil {
		return nil, err
	}
	return &agentv1.GetSessionResponse{Session: &agentv1.Session{Header: &sessionv1.SessionHeader{Id: req.GetSessionId(), Cwd: seen(ctx, p.name)}}}, nil
}

func (p *peer) StreamEvents(req *agentv1.StreamEventsRequest, ss grpc.ServerStreamingServer[agentv1.StreamEventsResponse]) error {
	if err := p.owns(req.GetSessionId()); err != nil {
		return err
	}
	for i := range 3 {
		ev := &sessionv1.SessionEvent{Seq: req.GetFromSeq() + int64(i)}
		if err := ss.Send(&agentv1.StreamEventsResponse{Event: ev}); err != nil {
			return err
		}
	}
	return status.Error(codes.OK, "")
}

// serve starts a replica stand-in with the Forwarder installed.
func serve(t testing.TB, p *peer, lis net.Listener) {
	t.Helper()
	fwd := cluster.NewForwarder(func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}, nil)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(fwd.Unary()), grpc.ChainStreamInterceptor(fwd.Stream()))
	agentv1.RegisterAgentServiceServer(srv, p)
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Stop(); fwd.Close() })
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func client(t *testing.T, addr string) agentv1.AgentServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentv1.NewAgentServiceClient(conn)
}

// TestForwarding: a call to a replica that does not own the session is
// answered by the owner, with the caller's metadata and deadline, unary and
// streaming; a call forwarded once is never forwarded again.
func TestForwarding(t *testing.T) {
	t.Parallel()
	la, lb := listen(t), listen(t)
	serve(t, &peer{name: "a", elsewhere: lb.Addr().String()}, la)
	serve(t, &peer{name: "b", elsewhere: la.Addr().String()}, lb)
	front := client(t, la.Addr().String())

	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "x-caller", "tenant-7"), 30*time.Second)
	defer cancel()
	tests := []struct {
		id, want string
	}{
		{"a-local", "a|tenant-7||deadline"},   // served where it arrived
		{"b-remote", "b|tenant-7|1|deadline"}, // forwarded to b, metadata and deadline kept
	}
	for _, tt := range tests {
		resp, err := front.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: tt.id})
		if err != nil {
			t.Fatalf("GetSession(%s): %v", tt.id, err)
		}
		if got := resp.GetSession().GetHeader().GetCwd(); got != tt.want {
			t.Errorf("GetSession(%s) was served as %q, want %q", tt.id, got, tt.want)
		}
	}

	// Streaming: every message of the owner comes through, then the end.
	stream, err := front.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "b-remote", FromSeq: 10})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Recv after %v: %v", seqs, err)
		}
		seqs = append(seqs, resp.GetEvent().GetSeq())
	}
	if len(seqs) != 3 || seqs[0] != 10 || seqs[2] != 12 {
		t.Fatalf("forwarded stream gave seqs %v, want 10 11 12", seqs)
	}

	// Neither replica owns it: one hop, then the refusal comes back
	// (naming the owner's address) instead of a loop.
	_, err = front.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "nobody"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), la.Addr().String()) {
		t.Fatalf("GetSession of a session owned by neither = %v; want UNAVAILABLE after one hop", err)
	}
	refused, err := front.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "nobody"})
	if err == nil {
		_, err = refused.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("StreamEvents of a session owned by neither = %v; want UNAVAILABLE", err)
	}
}

// BenchmarkForwarding measures the cost a non-owner adds to a unary call
// (compare the direct call, same run).
func BenchmarkForwarding(b *testing.B) {
	la, lb := listen(b), listen(b)
	serve(b, &peer{name: "a", elsewhere: lb.Addr().String()}, la)
	serve(b, &peer{name: "b", elsewhere: la.Addr().String()}, lb)
	conn, err := grpc.NewClient(la.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := agentv1.NewAgentServiceClient(conn)
	for _, id := range []string{"a-direct", "b-forwarded"} {
		b.Run(id, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.GetSession(b.Context(), &agentv1.GetSessionRequest{SessionId: id}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
