package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/cputime"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// benchChunks is how many messages the streaming benchmark sends per call:
// about a model step's worth of text chunks.
const benchChunks = 20

// benchDesc is a service shaped like dsh's: a unary call (PrepareCalls,
// GetWorkspaceContext) and a server stream of small messages (the gateway's
// Stream, the toolhost's Execute).
var benchDesc = grpc.ServiceDesc{
	ServiceName: "dsh.test.Bench",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(_ context.Context, req any) (any, error) {
				v := req.(*wrapperspb.StringValue).GetValue()
				if c, ok := strings.CutPrefix(v, "fail:"); ok { // the metrics test's failures
					n, _ := strconv.Atoi(c)
					return nil, status.Error(codes.Code(n), "asked to fail")
				}
				return wrapperspb.String(v), nil
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/dsh.test.Bench/Unary"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			in := new(wrapperspb.StringValue)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			out := wrapperspb.String("a chunk of model text ")
			for range benchChunks {
				if err := ss.SendMsg(out); err != nil {
					return err
				}
			}
			return nil
		},
	}, {
		// Echo answers each message with one: a call's request and reply,
		// one call per stream or many on one long-lived stream.
		StreamName:    "Echo",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			in := new(wrapperspb.StringValue)
			for {
				if err := ss.RecvMsg(in); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if err := ss.SendMsg(in); err != nil {
					return err
				}
			}
		},
	}},
}

// benchMode installs the otel globals of one deployment: nothing recorded
// (no exporter, no --debug-addr), metrics only (--debug-addr's Prometheus
// reader), or metrics and traces (an OTLP endpoint).
func benchMode(b *testing.B, mode string) {
	var tp trace.TracerProvider = tracenoop.NewTracerProvider()
	var mp metric.MeterProvider = metricnoop.NewMeterProvider()
	switch mode {
	case "metrics", "metrics-otelgrpc":
		smp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = smp.Shutdown(context.Background()) })
		mp = smp
	case "traces":
		smp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		stp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discardSpans{}))
		b.Cleanup(func() { _ = smp.Shutdown(context.Background()); _ = stp.Shutdown(context.Background()) })
		mp, tp = smp, stp
	}
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	b.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
}

type discardSpans struct{ sdktrace.SpanProcessor }

func (discardSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discardSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discardSpans) Shutdown(context.Context) error                  { return nil }
func (discardSpans) ForceFlush(context.Context) error                { return nil }

func startBench(b testing.TB) *grpc.ClientConn { return startBenchWith(b, Config{}) }

// startBenchWith serves benchDesc with cfg and dials it with opts.
func startBenchWith(b testing.TB, cfg Config, opts ...grpc.DialOption) *grpc.ClientConn {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := New(cfg)
	srv.RegisterService(&benchDesc, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	conn, err := Dial(lis.Addr().String(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(); cancel(); <-done })
	return conn
}

// benchLoop runs op b.N times with conc callers and reports the process CPU
// (client and server together) per op, which holds up on a busy machine
// where wall time does not.
func benchLoop(b *testing.B, conc int, op func() error) {
	if err := op(); err != nil { // warm the connection
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(conc)
	start := cputime.Process()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// benchModes are the telemetry set-ups compared; metrics-otelgrpc is
// "metrics" with otelgrpc's own handlers recording the RPC metrics, as
// before rpcMetrics.
var benchModes = []string{"off", "off-workers", "metrics", "metrics-workers", "metrics-otelgrpc", "traces"}

// benchConn starts the benchmark server and client of a mode.
func benchConn(b *testing.B, mode string) *grpc.ClientConn {
	base, workers := strings.CutSuffix(mode, "-workers")
	benchMode(b, base)
	if workers {
		return startBenchWith(b, Config{Options: []grpc.ServerOption{grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))}})
	}
	if mode != "metrics-otelgrpc" {
		return startBench(b)
	}
	return startBenchWith(b, Config{Tracing: TracingOff, Options: []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithFilter(instrumented)))}},
		WithTracing(TracingOff), grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithFilter(instrumented))))
}

// BenchmarkUnary is one unary call through New and Dial (client and server
// in this process), for each telemetry mode, with 64 concurrent callers (a
// loaded harness has hundreds of calls in flight, which is what makes
// handler goroutines grow their stacks).
func BenchmarkUnary(b *testing.B) {
	req := wrapperspb.String(strings.Repeat("x", 64))
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			conn := benchConn(b, mode)
			benchLoop(b, 64/max(1, runtimeProcs()), func() error {
				return conn.Invoke(context.Background(), "/dsh.test.Bench/Unary", req, new(wrapperspb.StringValue))
			})
		})
	}
}

// BenchmarkStream is one server-streaming call of benchChunks messages.
func BenchmarkStream(b *testing.B) {
	req := wrapperspb.String("go")
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			conn := benchConn(b, mode)
			benchLoop(b, 64/max(1, runtimeProcs()), func() error {
				cs, err := sendOnly(conn, &benchDesc.Streams[0], "/dsh.test.Bench/Stream", req)
				if err != nil {
					return err
				}
				out := new(wrapperspb.StringValue)
				for {
					if err := cs.RecvMsg(out); err != nil {
						if errors.Is(err, io.EOF) {
							return nil
						}
						return err
					}
				}
			})
		})
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// sendOnly opens a stream of desc, sends req and closes the sending side.
func sendOnly(conn *grpc.ClientConn, desc *grpc.StreamDesc, method string, req any) (grpc.ClientStream, error) {
	cs, err := conn.NewStream(context.Background(), desc, method)
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(req); err != nil {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	return cs, nil
}

// BenchmarkCallShapes prices the shape of a call, the same request and
// reply (a tool call's size) with 64 concurrent callers: a unary call, a
// stream per call (as a model step's Generate and a tool's PrepareExecute
// are), and one exchange on a long-lived stream each caller opened once (a
// protocol that multiplexed a session's calls on one stream). The gap
// between the last and the others is what stream set-up (headers,
// trailers, the handler's goroutine, the interceptors and stats handlers)
// costs per call (docs/arch/throughput.md §40).
func BenchmarkCallShapes(b *testing.B) {
	req := wrapperspb.String(strings.Repeat("x", 512))
	echo := &benchDesc.Streams[1]
	for _, mode := range []string{"off", "metrics"} {
		b.Run("mode="+mode+"/shape=unary", func(b *testing.B) {
			conn := benchConn(b, mode)
			benchLoop(b, 64/max(1, runtimeProcs()), func() error {
				return conn.Invoke(context.Background(), "/dsh.test.Bench/Unary", req, new(wrapperspb.StringValue))
			})
		})
		b.Run("mode="+mode+"/shape=stream-per-call", func(b *testing.B) {
			conn := benchConn(b, mode)
			benchLoop(b, 64/max(1, runtimeProcs()), func() error {
				cs, err := sendOnly(conn, echo, "/dsh.test.Bench/Echo", req)
				if err != nil {
					return err
				}
				out := new(wrapperspb.StringValue)
				if err := cs.RecvMsg(out); err != nil {
					return err
				}
				if err := cs.RecvMsg(out); !errors.Is(err, io.EOF) {
					return fmt.Errorf("after the reply: %v, want EOF", err)
				}
				return nil
			})
		})
		b.Run("mode="+mode+"/shape=long-lived-stream", func(b *testing.B) {
			conn := benchConn(b, mode)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			b.SetParallelism(64 / max(1, runtimeProcs()))
			start := cputime.Process()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				cs, err := conn.NewStream(ctx, echo, "/dsh.test.Bench/Echo")
				if err != nil {
					b.Error(err)
					return
				}
				defer func() { _ = cs.CloseSend() }()
				out := new(wrapperspb.StringValue)
				for pb.Next() {
					if err := cs.SendMsg(req); err != nil {
						b.Error(err)
						return
					}
					if err := cs.RecvMsg(out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
