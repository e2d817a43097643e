package grpcserver

import (
	"context"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"
)

// probe is a tiny hand-written service (one unary and one server-streaming
// method) whose handlers report the span context they were called with.
type probe struct{ seen chan trace.SpanContext }

var probeDesc = grpc.ServiceDesc{
	ServiceName: "dsh.test.Probe",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Ping",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) {
				srv.(*probe).seen <- trace.SpanContextFromContext(ctx)
				return &emptypb.Empty{}, nil
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/dsh.test.Probe/Ping"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			if err := ss.RecvMsg(new(emptypb.Empty)); err != nil {
				return err
			}
			srv.(*probe).seen <- trace.SpanContextFromContext(ss.Context())
			return ss.SendMsg(&emptypb.Empty{})
		},
	}},
}

func callProbe(ctx context.Context, t *testing.T, conn *grpc.ClientConn, stream bool) {
	t.Helper()
	if !stream {
		if err := conn.Invoke(ctx, "/dsh.test.Probe/Ping", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
			t.Fatalf("Ping: %v", err)
		}
		return
	}
	cs, err := conn.NewStream(ctx, &probeDesc.Streams[0], "/dsh.test.Probe/Watch")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(emptypb.Empty)); err != nil {
		t.Fatalf("Watch: %v", err)
	}
}

func startProbe(t *testing.T, cfg Config, dial ...grpc.DialOption) (*probe, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &probe{seen: make(chan trace.SpanContext, 1)}
	srv := New(cfg)
	srv.RegisterService(&probeDesc, p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	conn, err := Dial(lis.Addr().String(), dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-done })
	return p, conn
}

func parentContext(t *testing.T) (context.Context, trace.SpanContext) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
	return trace.ContextWithSpanContext(t.Context(), sc), sc
}

func wait[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("handler was not called")
		panic("unreachable")
	}
}

// TestTracingOffPropagates checks that without the otelgrpc handlers a
// server still hands its handler the caller's trace context, for unary and
// streaming RPCs, so a non-exporting hop does not break a trace.
func TestTracingOffPropagates(t *testing.T) {
	// The propagator is a process global that telemetry.Setup installs; this
	// test installs the same one (other tests do not depend on it).
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	p, conn := startProbe(t, Config{Tracing: TracingOff}, WithTracing(TracingOff))
	for _, stream := range []bool{false, true} {
		ctx, parent := parentContext(t)
		callProbe(ctx, t, conn, stream)
		got := wait(t, p.seen)
		if got.TraceID() != parent.TraceID() || got.SpanID() != parent.SpanID() || !got.IsRemote() || !got.IsSampled() {
			t.Errorf("stream=%v: handler saw %+v, want remote %s/%s sampled", stream, got, parent.TraceID(), parent.SpanID())
		}
		// A call with no trace context arrives with none.
		callProbe(t.Context(), t, conn, stream)
		if got := wait(t, p.seen); got.IsValid() {
			t.Errorf("stream=%v: untraced call arrived with span context %+v", stream, got)
		}
	}
}

// TestTracingAutoRecordsSpans installs an SDK tracer provider as the global,
// as telemetry.Setup does when exporting, and checks that TracingAuto then
// gives client and server spans in the caller's trace, and none for health
// checks.
func TestTracingAutoRecordsSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()); _ = tp.Shutdown(context.Background()) })

	p, conn := startProbe(t, Config{})
	ctx, parent := parentContext(t)
	callProbe(ctx, t, conn, false)
	got := wait(t, p.seen)
	if got.TraceID() != parent.TraceID() || got.SpanID() == parent.SpanID() || got.IsRemote() {
		t.Fatalf("handler saw %+v, want a local server span in trace %s", got, parent.TraceID())
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	var kinds []trace.SpanKind
	deadline := time.Now().Add(10 * time.Second)
	for len(kinds) < 2 && time.Now().Before(deadline) {
		kinds = kinds[:0]
		for _, s := range rec.Ended() {
			if s.Name() != "dsh.test.Probe/Ping" {
				t.Errorf("unexpected span %q", s.Name())
			}
			if s.SpanContext().TraceID() != parent.TraceID() {
				t.Errorf("span %q in trace %s, want %s", s.Name(), s.SpanContext().TraceID(), parent.TraceID())
			}
			kinds = append(kinds, s.SpanKind())
		}
		time.Sleep(time.Millisecond)
	}
	if len(kinds) != 2 {
		t.Fatalf("got span kinds %v, want one client and one server span", kinds)
	}
}

func TestRecords(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	for _, tc := range []struct {
		name string
		p    any
		want bool
	}{
		{"noop tracer", tracenoop.NewTracerProvider(), false},
		{"sdk tracer", tp, true},
		{"sdk meter", mp, true},
		{"nil", nil, false},
	} {
		if got := records(tc.p); got != tc.want {
			t.Errorf("%s: records = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := TracingOn.enabled(); !got {
		t.Error("TracingOn.enabled() = false")
	}
	if got := TracingOff.enabled(); got {
		t.Error("TracingOff.enabled() = true")
	}
}
