// Package proctest runs dsh binaries as real processes in tests: build a
// main package, start it on a free loopback port, and wait until its gRPC
// health service says SERVING.
package proctest

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
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

// handedOut holds the ports FreeAddr returned in this process: the OS may
// hand a port it just freed to the next listen, so two calls of one test
// could get the same port for two processes that have not bound it yet
// (an agent's health port collided with its gateway's in CI).
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreeAddr returns a loopback address with a port the OS just handed out
// and that no earlier call in this process returned. Another process may
// still take it before the caller's process binds it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().(*net.TCPAddr)
		lis.Close()
		handedOut.Lock()
		seen := handedOut.ports[addr.Port]
		handedOut.ports[addr.Port] = true
		handedOut.Unlock()
		if !seen {
			return addr.String()
		}
	}
	t.Fatal("proctest: no loopback port not handed out before in 100 tries")
	return ""
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
