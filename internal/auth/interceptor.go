package auth

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/dsh-dev/dsh/internal/telemetry"
)

// DenialCounter counts refused requests (telemetry.Metrics implements it).
type DenialCounter interface {
	RecordDenial(ctx context.Context, rpc, code string)
}

// OpenMethod reports whether a method is served without authentication or
// peer checks: only the gRPC health service, so that load balancers and
// kubelet probes can ask whether the server is up (it reveals nothing else).
// Under mTLS a prober still needs a client certificate to complete the
// handshake.
func OpenMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/")
}

func newDenier(log *slog.Logger, c DenialCounter) denier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if c == nil {
		// The global provider delegates to the one telemetry.Setup installs,
		// even when Setup runs later; nil *Metrics counts nothing.
		m, _ := telemetry.NewMetrics(nil)
		c = m
	}
	return denier{log: log, counter: c}
}

// denier logs and counts a denial and returns the status error the caller
// gets. It never logs a credential.
type denier struct {
	log     *slog.Logger
	counter DenialCounter
}

func (d denier) deny(ctx context.Context, p *Principal, t Target, err error) error {
	code := codes.PermissionDenied
	reason := err.Error()
	var ae *Error
	if errors.As(err, &ae) {
		code, reason = ae.Code, ae.Reason
	} else if st, ok := status.FromError(err); ok {
		code, reason = st.Code(), st.Message()
	}
	attrs := []any{"rpc", t.FullMethod, "code", code.String(), "reason", reason}
	if t.SessionID != "" {
		attrs = append(attrs, "session", t.SessionID)
	}
	if p != nil {
		attrs = append(attrs, "tenant", p.Tenant, "subject", p.Subject)
	}
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		attrs = append(attrs, "peer", pr.Addr.String())
	}
	d.log.WarnContext(ctx, "request denied", attrs...)
	d.counter.RecordDenial(ctx, t.FullMethod, code.String())
	return status.Error(code, reason)
}

// EdgeConfig configures the agent's edge: who the caller is and whether it
// may make the call.
type EdgeConfig struct {
	Authn Authenticator // required
	Authz Authorizer    // nil: Roles{}
	// Denials counts refused requests; nil means the dsh.auth.denials
	// counter of the global meter provider (telemetry.Setup installs it).
	Denials DenialCounter
	Logger  *slog.Logger
}

// Edge authenticates each request, authorizes it and puts the Principal in
// the handler's context (FromContext). For streaming RPCs the request
// message is authorized when the handler reads it, so an Authorizer sees the
// session id of every RPC.
type Edge struct {
	authn Authenticator
	authz Authorizer
	denier
}

// NewEdge returns the edge of cfg.
func NewEdge(cfg EdgeConfig) *Edge {
	if cfg.Authz == nil {
		cfg.Authz = Roles{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Edge{authn: cfg.Authn, authz: cfg.Authz, denier: newDenier(cfg.Logger, cfg.Denials)}
}

// ServerOptions installs the edge's interceptors.
func (e *Edge) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(e.Unary), grpc.ChainStreamInterceptor(e.Stream)}
}

// authenticate returns the principal of ctx's credentials.
func (e *Edge) authenticate(ctx context.Context, method string) (Principal, error) {
	if _, none := e.authn.(None); none {
		return Local(), nil // --auth none reads no credentials
	}
	bearer, err := bearerOf(ctx)
	if err == nil {
		var p Principal
		if p, err = e.authn.Authenticate(ctx, bearer); err == nil {
			return p, nil
		}
	}
	return Principal{}, e.deny(ctx, nil, Target{FullMethod: method}, err)
}

func (e *Edge) authorize(ctx context.Context, p Principal, t Target) error {
	if err := e.authz.Authorize(ctx, p, t); err != nil {
		return e.deny(ctx, &p, t, err)
	}
	return nil
}

// Unary is the unary server interceptor.
func (e *Edge) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if OpenMethod(info.FullMethod) {
		return h(ctx, req)
	}
	p, err := e.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if err := e.authorize(ctx, p, targetOf(info.FullMethod, req)); err != nil {
		return nil, err
	}
	return h(WithPrincipal(ctx, p), req)
}

// Stream is the stream server interceptor.
func (e *Edge) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if OpenMethod(info.FullMethod) {
		return h(srv, ss)
	}
	ctx := ss.Context()
	p, err := e.authenticate(ctx, info.FullMethod)
	if err != nil {
		return err
	}
	if !info.IsClientStream {
		// Server streaming: the handler reads exactly one request first.
		return h(srv, &authzStream{ServerStream: ss, ctx: WithPrincipal(ctx, p), e: e, p: p, method: info.FullMethod})
	}
	// Client streams carry no single session: authorize the method.
	if err := e.authorize(ctx, p, Target{FullMethod: info.FullMethod}); err != nil {
		return err
	}
	return h(srv, &authzStream{ServerStream: ss, ctx: WithPrincipal(ctx, p), done: true})
}

// authzStream authorizes the first request message of a server stream.
type authzStream struct {
	grpc.ServerStream
	ctx    context.Context
	e      *Edge
	p      Principal
	method string
	done   bool
}

func (s *authzStream) Context() context.Context { return s.ctx }

func (s *authzStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.done {
		return nil
	}
	s.done = true
	return s.e.authorize(s.ctx, s.p, targetOf(s.method, m))
}

// targetOf reads the session and tenant a request names.
func targetOf(method string, req any) Target {
	t := Target{FullMethod: method}
	if r, ok := req.(interface{ GetSessionId() string }); ok {
		t.SessionID = r.GetSessionId()
	}
	if r, ok := req.(interface{ GetTenant() string }); ok {
		t.Tenant = r.GetTenant()
	}
	return t
}

// bearerOf returns the bearer token of the request's authorization
// metadata ("" when there is none).
func bearerOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", unauthenticated("the request carries %d authorization headers; send exactly one `authorization: Bearer <token>`", len(vals))
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
		return "", unauthenticated("the authorization metadata must be `Bearer <token>`")
	}
	return strings.TrimSpace(tok), nil
}
