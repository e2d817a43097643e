package toolsdk_test

import (
	"context"
	"github.com/dsh-dev/dsh/internal/cputime"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

func noopHost(b *testing.B) *toolsdk.Host {
	noop := toolsdk.Define("noop", "Does nothing.", func(context.Context, *toolsdk.Call, echoArgs) (toolsdk.Result, error) {
		return toolsdk.Text("ok"), nil
	})
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, noop)
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// loop runs op b.N times and also reports CPU time per op (client and
// server together), a figure that holds up on a busy machine where wall
// time does not.
func loop(b *testing.B, op func()) {
	op() // warm the connection
	b.ReportAllocs()
	start := cputime.Process()
	n := 0
	for b.Loop() {
		op()
		n++
	}
	b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(n), "cpu-ns/op")
}

// BenchmarkExecuteRoundTrip is one Execute of a trivial typed tool over
// loopback gRPC through the production stack (grpcserver with health,
// reflection, recovery and trace-context pass-through; otelgrpc is installed
// only when a recording OpenTelemetry provider is set, which this benchmark
// does not do; client dialled with grpcserver.Dial): request, context checks,
// argument validation, body, presenter, result, end of stream.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	c := startHost(b, noopHost(b))
	req := exec("noop", `{"text":"hi"}`)
	ctx := context.Background()
	loop(b, func() {
		_, res, err := collect(ctx, b, c, req)
		if err != nil || res.GetIsError() {
			b.Fatalf("err %v res %v", err, res)
		}
	})
}

// BenchmarkExecuteRoundTripBareGRPC is the same call on a bare grpc.Server
// and client without OpenTelemetry, to separate the SDK's cost from the
// instrumentation's.
func BenchmarkExecuteRoundTripBareGRPC(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	noopHost(b).Register(srv)
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	c := toolsv1.NewToolHostClient(conn)
	req := exec("noop", `{"text":"hi"}`)
	ctx := context.Background()
	loop(b, func() {
		_, res, err := collect(ctx, b, c, req)
		if err != nil || res.GetIsError() {
			b.Fatalf("err %v res %v", err, res)
		}
	})
}

// BenchmarkListToolsRoundTrip is a unary call on the same stack: the floor a
// loopback gRPC round trip costs here.
func BenchmarkListToolsRoundTrip(b *testing.B) {
	c := startHost(b, noopHost(b))
	ctx := context.Background()
	loop(b, func() {
		if _, err := c.ListTools(ctx, &toolsv1.ListToolsRequest{}); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkRunInProcess is the host's own work for one call, no transport.
func BenchmarkRunInProcess(b *testing.B) {
	h := noopHost(b)
	ex := exec("noop", `{"text":"hi"}`).GetExecution()
	ctx := context.Background()
	loop(b, func() {
		if r := h.Run(ctx, ex, nil); r.GetIsError() {
			b.Fatal(r)
		}
	})
}
