package grpcserver

import (
	"context"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// Tracing selects how a server or client connection is instrumented.
//
// Full instrumentation (otelgrpc stats handlers: a span and a duration
// metric per RPC) costs tens of microseconds per call even when the
// providers are no-ops, so it is installed only when something records,
// and only the part that records: otelgrpc's handler for spans when the
// tracer provider records, and rpcMetrics (otelgrpc's duration metric with
// cached attribute sets, less than half the cost) when the meter provider
// records, e.g. for --debug-addr. Without otelgrpc's spans, trace context
// still passes through: a cheap interceptor carries an incoming traceparent
// into the handler's context, and outgoing calls whose context holds a
// span context send it on.
type Tracing int

const (
	// TracingAuto instruments fully when, at New or Dial time, the otel
	// global tracer or meter provider records (an SDK provider, as
	// telemetry.Setup installs when an exporter is configured), and
	// propagates only otherwise. It is the zero value.
	TracingAuto Tracing = iota
	// TracingOn always instruments: as TracingAuto does when something
	// records, and with otelgrpc's handlers when nothing does.
	TracingOn
	// TracingOff never installs stats handlers; trace context is still
	// propagated.
	TracingOff
)

// TracingFor returns TracingOn when on is true and TracingOff otherwise; pass
// it the Tracing || Metering of a telemetry.Setup result.
func TracingFor(on bool) Tracing {
	if on {
		return TracingOn
	}
	return TracingOff
}

// enabled resolves TracingAuto against the otel globals.
func (t Tracing) enabled() bool {
	switch t {
	case TracingOn:
		return true
	case TracingOff:
		return false
	}
	return records(otel.GetTracerProvider()) || records(otel.GetMeterProvider())
}

// records reports whether p is an SDK provider. The no-op providers and the
// otel global delegate (before any provider is set) cannot be flushed or
// shut down; the SDK providers of go.opentelemetry.io/otel/sdk can.
func records(p any) bool {
	_, ok := p.(interface {
		ForceFlush(context.Context) error
		Shutdown(context.Context) error
	})
	return ok
}

// instrumented excludes the services whose RPCs get no spans: probes and
// tooling, not work.
func instrumented(info *stats.RPCTagInfo) bool {
	m := info.FullMethodName
	return !strings.HasPrefix(m, "/grpc.health.v1.Health/") && !strings.HasPrefix(m, "/grpc.reflection.")
}

// instrumentation is what a server or connection installs: otelgrpc's
// handler (spans, and its metrics unless rpcMetrics records them) and the
// lean metrics handler.
type instrumentation struct{ spans, metrics bool }

// instrumentation resolves t against the otel globals: otelgrpc when a
// tracer records (or when rpcMetrics cannot stand in for its metrics), and
// rpcMetrics whenever a meter records.
func (t Tracing) instrumentation() instrumentation {
	if !t.enabled() {
		return instrumentation{}
	}
	lean := records(otel.GetMeterProvider()) && leanMetricsOK()
	return instrumentation{spans: records(otel.GetTracerProvider()) || !lean, metrics: lean}
}

// handlers returns the stats handlers of a server (client false) or client
// connection.
func (in instrumentation) handlers(client bool) []stats.Handler {
	var hs []stats.Handler
	if in.spans {
		opts := []otelgrpc.Option{otelgrpc.WithFilter(instrumented)}
		if in.metrics {
			opts = append(opts, otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()))
		}
		if client {
			hs = append(hs, otelgrpc.NewClientHandler(opts...))
		} else {
			hs = append(hs, otelgrpc.NewServerHandler(opts...))
		}
	}
	if in.metrics {
		hs = append(hs, newRPCMetrics(otel.GetMeterProvider(), client))
	}
	return hs
}

// tracingOption marks a dial option choosing the connection's Tracing (see
// WithTracing). It carries no grpc behaviour of its own.
type tracingOption struct {
	grpc.EmptyDialOption
	t Tracing
}

// WithTracing is a Dial option choosing the connection's instrumentation;
// without it Dial uses TracingAuto.
func WithTracing(t Tracing) grpc.DialOption { return tracingOption{t: t} }

func dialTracing(opts []grpc.DialOption) Tracing {
	t := TracingAuto
	for _, o := range opts {
		if to, ok := o.(tracingOption); ok {
			t = to.t
		}
	}
	return t
}

// The propagation-only path. It uses the global text-map propagator (W3C
// trace context and baggage once telemetry.Setup ran) and does nothing at
// all for calls that carry no trace context, so an untraced deployment pays
// a metadata lookup per RPC.

// mdCarrier adapts gRPC metadata to a propagation.TextMapCarrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (c mdCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }
func (c mdCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

var _ propagation.TextMapCarrier = mdCarrier{}

// extractCtx returns ctx with the incoming trace context, if the caller sent
// any, as the remote parent span context.
func extractCtx(ctx context.Context) context.Context {
	// FromIncomingContext copies the whole metadata; look first.
	if len(metadata.ValueFromIncomingContext(ctx, "traceparent")) == 0 && len(metadata.ValueFromIncomingContext(ctx, "baggage")) == 0 {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return otel.GetTextMapPropagator().Extract(ctx, mdCarrier(md))
}

// injectCtx returns ctx with its span context and baggage added to the
// outgoing metadata, or ctx itself when it has neither.
func injectCtx(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	otel.GetTextMapPropagator().Inject(ctx, mdCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// ctxStream is a server stream with a replaced context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

func injectUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(injectCtx(ctx), method, req, reply, cc, opts...)
}

func injectStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(injectCtx(ctx), desc, cc, method, opts...)
}
