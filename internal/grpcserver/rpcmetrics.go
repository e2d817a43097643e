package grpcserver

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/rpcconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// rpcMetrics is a stats.Handler that records exactly the RPC metric of
// otelgrpc's stats handlers (rpc.server.call.duration or
// rpc.client.call.duration of semantic conventions v1.43, under otelgrpc's
// instrumentation scope, with its buckets and attributes: rpc.method,
// rpc.system.name, rpc.response.status_code, error.type on failure and, on
// the client, server.address and server.port of the peer) at a fraction of
// its cost. otelgrpc builds and hashes a new attribute set at the end of
// every RPC (attribute.NewSet: 4 % of the agent's CPU under load, and the
// main cause of its handler goroutines growing their stacks); this handler
// builds each distinct set once and records with the cached one. Spans stay
// otelgrpc's (installed beside this handler, with its metrics off, when a
// tracer records).
//
// The caches are bounded (maxCachedSets), so a client sending calls to
// made-up method names cannot grow them: past the bound a set is built per
// call, as otelgrpc does.
type rpcMetrics struct {
	client bool
	dur    metric.Float64Histogram

	methods sync.Map     // full method name -> *methodSets
	cached  atomic.Int64 // entries in methods and in every methodSets.byAddr
}

// maxCachedSets bounds the cached methods and (method, peer) pairs of one
// handler.
const maxCachedSets = 1024

// methodSets holds the attribute sets of one method, per status code (and,
// on the client, per peer address).
type methodSets struct {
	base   []attribute.KeyValue                                     // rpc.method, rpc.system.name
	byCode [codes.Unauthenticated + 1]atomic.Pointer[attribute.Set] // server
	byAddr sync.Map                                                 // client: addrCode -> *attribute.Set
}

type addrCode struct {
	addr string
	code codes.Code
}

// rpcCall is the per-call state TagRPC leaves in the context.
type rpcCall struct {
	sets *methodSets
	addr atomic.Pointer[string] // client: the peer, from OutHeader
}

type rpcCallKey struct{}

// leanMetricsOK reports whether rpcMetrics reproduces otelgrpc's metrics:
// with OTEL_SEMCONV_STABILITY_OPT_IN asking for the old or duplicated RPC
// conventions, otelgrpc records other instruments and stays in charge.
func leanMetricsOK() bool {
	for p := range strings.SplitSeq(os.Getenv("OTEL_SEMCONV_STABILITY_OPT_IN"), ",") {
		if p = strings.TrimSpace(p); p == "rpc/dup" || p == "rpc/old" {
			return false
		}
	}
	return true
}

// newRPCMetrics returns the handler of a server (client false) or client
// connection, recording on mp as otelgrpc would.
func newRPCMetrics(mp metric.MeterProvider, client bool) *rpcMetrics {
	meter := mp.Meter(otelgrpc.ScopeName, metric.WithInstrumentationVersion(otelgrpc.Version), metric.WithSchemaURL(semconv.SchemaURL))
	// otelgrpc's buckets.
	buckets := metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
	h := &rpcMetrics{client: client}
	var err error
	if client {
		d, e := rpcconv.NewClientCallDuration(meter, buckets)
		h.dur, err = d.Inst(), e
	} else {
		d, e := rpcconv.NewServerCallDuration(meter, buckets)
		h.dur, err = d.Inst(), e
	}
	if err != nil {
		otel.Handle(err) // h.dur is then a no-op instrument
	}
	return h
}

func (h *rpcMetrics) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h *rpcMetrics) HandleConn(context.Context, stats.ConnStats)                       {}

func (h *rpcMetrics) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if !instrumented(info) {
		return ctx
	}
	return context.WithValue(ctx, rpcCallKey{}, &rpcCall{sets: h.method(info.FullMethodName)})
}

// method returns the cached sets of a method, or fresh ones past the bound.
func (h *rpcMetrics) method(name string) *methodSets {
	if v, ok := h.methods.Load(name); ok {
		return v.(*methodSets)
	}
	ms := &methodSets{base: []attribute.KeyValue{semconv.RPCSystemNameGRPC}}
	if rest, ok := strings.CutPrefix(name, "/"); ok { // otelgrpc's ParseFullMethod
		ms.base = append(ms.base, semconv.RPCMethod(rest))
	}
	if h.cached.Load() >= maxCachedSets {
		return ms
	}
	v, loaded := h.methods.LoadOrStore(name, ms)
	if !loaded {
		h.cached.Add(1)
	}
	return v.(*methodSets)
}

func (h *rpcMetrics) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	switch rs := rs.(type) {
	case *stats.OutHeader:
		if rs.Client && rs.RemoteAddr != nil {
			if call, ok := ctx.Value(rpcCallKey{}).(*rpcCall); ok {
				addr := rs.RemoteAddr.String()
				call.addr.Store(&addr)
			}
		}
	case *stats.End:
		call, ok := ctx.Value(rpcCallKey{}).(*rpcCall)
		if !ok || !h.dur.Enabled(ctx) {
			return
		}
		code := codes.OK
		if rs.Error != nil {
			code = status.Code(rs.Error)
		}
		elapsed := float64(rs.EndTime.Sub(rs.BeginTime)) / float64(time.Second)
		h.dur.Record(ctx, elapsed, metric.WithAttributeSet(*h.set(call, code)))
	}
}

// set returns the attribute set of a call that ended with code.
func (h *rpcMetrics) set(call *rpcCall, code codes.Code) *attribute.Set {
	ms := call.sets
	if !h.client {
		if int(code) >= len(ms.byCode) {
			return h.build(ms, "", code)
		}
		if s := ms.byCode[code].Load(); s != nil {
			return s
		}
		s := h.build(ms, "", code)
		ms.byCode[code].Store(s)
		return s
	}
	var addr string
	if p := call.addr.Load(); p != nil {
		addr = *p
	}
	key := addrCode{addr, code}
	if v, ok := ms.byAddr.Load(key); ok {
		return v.(*attribute.Set)
	}
	s := h.build(ms, addr, code)
	if h.cached.Load() < maxCachedSets {
		if _, loaded := ms.byAddr.LoadOrStore(key, s); !loaded {
			h.cached.Add(1)
		}
	}
	return s
}

// build makes the set otelgrpc records for a call: its method attributes,
// the peer (client), the status code and, when the call failed by the
// rules of its side, error.type.
func (h *rpcMetrics) build(ms *methodSets, addr string, code codes.Code) *attribute.Set {
	attrs := append(make([]attribute.KeyValue, 0, len(ms.base)+4), ms.base...)
	if h.client && addr != "" {
		attrs = append(attrs, serverAddrAttrs(addr)...)
	}
	attrs = append(attrs, semconv.RPCResponseStatusCode(canonicalCode(code)))
	if code != codes.OK && (h.client || serverError(code)) {
		attrs = append(attrs, semconv.ErrorTypeKey.String(canonicalCode(code)))
	}
	s := attribute.NewSet(attrs...)
	return &s
}

// serverAddrAttrs is otelgrpc's server.address and server.port of a peer.
func serverAddrAttrs(hostport string) []attribute.KeyValue {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return []attribute.KeyValue{semconv.ServerAddress(hostport)}
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return []attribute.KeyValue{semconv.ServerAddress(host)}
	}
	return []attribute.KeyValue{semconv.ServerAddress(host), semconv.ServerPort(p)}
}

// serverError reports whether a server that returned code failed (otelgrpc's
// rule: the codes that are the server's fault, not the caller's).
func serverError(code codes.Code) bool {
	switch code {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// canonicalNames are the status code names of the gRPC specification, as
// otelgrpc writes them.
var canonicalNames = [...]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

func canonicalCode(c codes.Code) string {
	if int(c) < len(canonicalNames) {
		return canonicalNames[c]
	}
	return "CODE(" + strconv.FormatInt(int64(c), 10) + ")"
}
