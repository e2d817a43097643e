// Package proctest runs dsh binaries as real processes in tests: build a
// main package, start it on a free loopback port, and wait until its gRPC
// health service says SERVING.
package proctest

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Build compiles the main package in dir (relative to the test's package)
// into a temporary directory and returns the binary's path. It skips the
// test when no go toolchain is on PATH.
func Build(t testing.TB, dir, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go toolchain not on PATH")
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command(goBin, "build", "-o", bin, dir).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// FreeAddr returns a loopback address with a port the OS just handed out.
func FreeAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// WaitServing polls the health service on conn for service ("" for the
// whole server) until it is SERVING, failing the test when ctx ends first.
func WaitServing(ctx context.Context, t testing.TB, conn grpc.ClientConnInterface, service string) {
	t.Helper()
	health := healthpb.NewHealthClient(conn)
	for {
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never became healthy: %v", conn, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a separate process
	}
}
