package grpcserver

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// TestStatusAndHealthPort: a status set before Serve survives Serve
// (which would otherwise mark everything SERVING), the plaintext health
// port reports the same statuses as they change, and serves nothing else.
func TestStatusAndHealthPort(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv := New(Config{})
	const svc = "grpc.reflection.v1.ServerReflection"
	set := func(up bool) {
		for _, name := range []string{"", svc} {
			srv.SetStatus(name, up)
		}
	}
	set(false) // the database is down
	main, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- srv.Serve(ctx, main) }()
	go func() { done <- srv.ServeHealth(ctx, hl) }()
	conn, err := Dial(hl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, name := range []string{"", svc} {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
			if err != nil || resp.GetStatus() != want {
				t.Fatalf("health %q = %v, %v; want %v", name, resp.GetStatus(), err, want)
			}
		}
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	set(true)
	check(healthpb.HealthCheckResponse_SERVING)
	set(false) // lease renewal failing
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	// Only health is on the plaintext port.
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err == nil {
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("reflection on the health port: %v, want Unimplemented", err)
	}
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
