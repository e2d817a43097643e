package grpcserver

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// panicky is a health server whose Check panics, to prove recovery.
type panicky struct {
	healthpb.UnimplementedHealthServer
}

func (panicky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("boom")
}

// serveLocal serves srv on a loopback port the OS picks until cancel;
// done then gives Serve's result.
func serveLocal(t *testing.T, srv *Server) (addr string, ctx context.Context, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	return lis.Addr().String(), ctx, cancel, served
}

func start(t *testing.T, register func(*grpc.Server)) (*Server, *grpc.ClientConn, context.CancelFunc, <-chan error) {
	t.Helper()
	srv := New(Config{DrainTimeout: 2 * time.Second})
	if register != nil {
		register(srv.Server)
	}
	addr, _, cancel, done := serveLocal(t, srv)
	conn, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel() })
	return srv, conn, cancel, done
}

func TestHealthReflectionAndShutdown(t *testing.T) {
	t.Parallel()
	_, conn, cancel, done := start(t, nil)
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("status = %v, want SERVING", resp.GetStatus())
	}
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "grpc.health.v1.Health"}); err != nil {
		t.Fatalf("per-service health: %v", err)
	}

	rc, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range rr.GetListServicesResponse().GetService() {
		names[s.GetName()] = true
	}
	if !names["grpc.health.v1.Health"] || !names["grpc.reflection.v1.ServerReflection"] {
		t.Fatalf("reflection lists %v; want health and reflection", names)
	}
	_ = rc.CloseSend()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v after shutdown, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestPanicBecomesInternal(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A bare grpc server with only the recoverer, so the panicking health
	// implementation is the one registered.
	rec := recoverer{log: New(Config{}).cfg.Logger}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(rec.unary))
	healthpb.RegisterHealthServer(gs, panicky{})
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if got := status.Code(err); got != codes.Internal {
		t.Fatalf("code = %v (%v), want Internal", got, err)
	}
	if status.Convert(err).Message() != "internal error" {
		t.Fatalf("message %q leaks details", status.Convert(err).Message())
	}
}
