// Package grpcserver builds and runs the gRPC servers of every dsh service the
// same way: OpenTelemetry (otelgrpc spans when a recording tracer provider
// is installed, otelgrpc's RPC duration metrics when a recording meter
// provider is, trace-context pass-through otherwise; see Tracing),
// the gRPC health service, server reflection (so grpcurl works with no proto
// files), panic recovery that turns a handler panic into codes.Internal, and
// a graceful shutdown, and InvalidArgument (naming the field) for a request
// with invalid UTF-8 in a string field instead of grpc-go's Internal.
//
// # Shutdown
//
// Serve returns when its context is cancelled. It then marks every service
// NOT_SERVING, lets in-flight RPCs drain with GracefulStop, and falls back to
// a hard Stop after Config.DrainTimeout. Callers flush their own state (sessions,
// NATS, telemetry) after Serve returns.
package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// DefaultDrainTimeout bounds how long Serve waits for in-flight RPCs.
const DefaultDrainTimeout = 10 * time.Second

// Config configures a server.
type Config struct {
	// Logger receives lifecycle lines and recovered panics. Required.
	Logger *slog.Logger
	// DrainTimeout bounds GracefulStop; zero means DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Options are extra grpc.ServerOptions (credentials, size limits ...).
	Options []grpc.ServerOption
	// Tracing chooses the OpenTelemetry instrumentation; the zero value,
	// TracingAuto, instruments only when a recording provider is installed.
	Tracing Tracing
}

// Server is a grpc.Server with health and reflection registered.
type Server struct {
	*grpc.Server
	health *health.Server
	cfg    Config

	mu       sync.Mutex
	reported map[string]bool // names whose status the owner sets (SetStatus)
}

// New returns a server ready for service registration. Register services on
// it, then call Serve.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	rec := recoverer{log: cfg.Logger}
	// One interceptor per kind: a chain of two costs a closure per call.
	var opts []grpc.ServerOption
	in := cfg.Tracing.instrumentation()
	for _, h := range in.handlers(false) {
		opts = append(opts, grpc.StatsHandler(h))
	}
	// Without otelgrpc's spans the interceptor carries trace context.
	rec.propagate = !in.spans
	opts = append(opts, grpc.ChainUnaryInterceptor(rec.unary), grpc.ChainStreamInterceptor(rec.stream))
	opts = append(opts, grpc.ForceServerCodecV2(newUTF8Codec()))
	opts = append(opts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	opts = append(opts, cfg.Options...)
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return &Server{Server: gs, health: hs, cfg: cfg, reported: map[string]bool{}}
}

// SetServing marks the overall server and each named service SERVING,
// except the names whose status is set with SetStatus.
func (s *Server) SetServing(services ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range append([]string{""}, services...) {
		if !s.reported[name] {
			s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
		}
	}
}

// SetStatus sets the health of name ("" is the whole server) to SERVING or
// NOT_SERVING; from then on the owner, not Serve, decides that name's
// status. After Shutdown every name stays NOT_SERVING.
func (s *Server) SetStatus(name string, serving bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reported[name] = true
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(name, st)
}

// ServeHealth serves only the health service, in plaintext, on lis until
// ctx is cancelled: for probes that cannot speak TLS (kubelet's gRPC
// probes). It shares the statuses of s and exposes nothing else.
func (s *Server) ServeHealth(ctx context.Context, lis net.Listener) error {
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, s.health)
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("health serve %s: %w", lis.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	gs.Stop()
	<-errc
	return nil
}

// Serve serves on lis until ctx is cancelled, then shuts down gracefully. It
// marks every registered service SERVING before accepting connections,
// except those whose status the owner sets with SetStatus. The
// returned error is nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	names := make([]string, 0, len(s.GetServiceInfo()))
	for name := range s.GetServiceInfo() {
		names = append(names, name)
	}
	s.SetServing(names...) // except the names the owner sets (SetStatus)
	errc := make(chan error, 1)
	go func() { errc <- s.Server.Serve(lis) }()
	s.cfg.Logger.Info("grpc server listening", "addr", lis.Addr().String())
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc serve %s: %w", lis.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	s.Shutdown()
	<-errc
	return nil
}

// Shutdown marks the server NOT_SERVING, drains in-flight RPCs and stops,
// forcing a hard stop after the drain timeout. It is safe to call twice.
func (s *Server) Shutdown() {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.DrainTimeout):
		s.cfg.Logger.Warn("grpc drain timed out; stopping hard", "timeout", s.cfg.DrainTimeout)
		s.Stop()
		<-done
	}
}

// recoverer turns handler panics into codes.Internal and, when propagate is
// set (no otelgrpc handler installed), carries incoming trace context into
// the handler's context.
type recoverer struct {
	log       *slog.Logger
	propagate bool
}

func (r recoverer) recovered(method string, v any) error {
	r.log.Error("grpc handler panicked", "method", method, "panic", v, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error")
}

func (r recoverer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = r.recovered(info.FullMethod, v)
		}
	}()
	if err := checkUTF8(req); err != nil {
		return nil, err
	}
	if r.propagate {
		ctx = extractCtx(ctx)
	}
	return h(ctx, req)
}

func (r recoverer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = r.recovered(info.FullMethod, v)
		}
	}()
	if r.propagate {
		ctx := ss.Context()
		if nctx := extractCtx(ctx); nctx != ctx {
			ss = ctxStream{ServerStream: ss, ctx: nctx}
		}
	}
	return h(srv, utf8Stream{ss})
}

// utf8Stream refuses received messages that carried invalid UTF-8 (see
// utf8Codec).
type utf8Stream struct{ grpc.ServerStream }

func (s utf8Stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return checkUTF8(m)
}

// Flow-control windows of every client connection (see Dial).
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

// Dial opens a client connection to a dsh service with OpenTelemetry
// propagation (and spans when tracing is on; see Tracing and WithTracing). Addresses are host:port; connections are insecure unless opts
// say otherwise (loopback and in-cluster traffic; put TLS in opts). Calls are
// spread round-robin over every address the name resolves to (e.g.
// dns:///llmgateway:7701 of a headless Service: every ready pod).
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	var base []grpc.DialOption
	in := dialTracing(opts).instrumentation()
	for _, h := range in.handlers(true) {
		base = append(base, grpc.WithStatsHandler(h))
	}
	if !in.spans {
		base = append(base, grpc.WithChainUnaryInterceptor(injectUnary), grpc.WithChainStreamInterceptor(injectStream))
	}
	if !hasCreds(opts) {
		base = append(base, insecureCreds())
	}
	base = append(base, grpc.WithDefaultServiceConfig(roundRobin),
		// Static flow-control windows: with the default dynamic window the
		// client answers a stream of small messages (a model's chunks) with
		// bandwidth-estimator pings and window updates, which cost the
		// sender a wake-up and a read per chunk (docs/arch/throughput-gateway.md).
		// 1 MiB per stream and 16 MiB per connection are what the estimator
		// would grow to for our message sizes, fixed from the start.
		grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(connWindow))
	conn, err := grpc.NewClient(addr, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}
