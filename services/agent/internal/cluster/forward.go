package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// ReasonOwnedElsewhere is the ErrorInfo reason of the UNAVAILABLE status
// of a call naming a session another replica owns; its metadata carries
// "owner" and "address".
const ReasonOwnedElsewhere = "SESSION_OWNED_ELSEWHERE"

// ForwardedHeader marks a call a replica forwarded: the receiver serves it
// or refuses it, never forwards it again (a stale lease cannot bounce a call
// between replicas).
const ForwardedHeader = "dsh-forwarded"

// Status returns the gRPC status of e: UNAVAILABLE with an ErrorInfo
// naming the owner's address, which the Forwarder (and any client) reads.
func (e *OwnedElsewhereError) Status() *status.Status {
	st := status.New(codes.Unavailable, e.Error()+"; send the call there")
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonOwnedElsewhere, Domain: "dsh.dev",
		Metadata: map[string]string{"owner": e.Owner, "address": e.Address, "session_id": e.SessionID}}); err == nil {
		return d
	}
	return st
}

// Forwarder is a pair of server interceptors: a call the local handler
// refused because another replica owns its session is sent, once, to that
// replica's address, with the caller's metadata and deadline, and its
// answer (unary) or its messages (server streaming) are relayed back. A
// streaming call is forwarded only if the local handler sent nothing.
type Forwarder struct {
	dial func(addr string) (*grpc.ClientConn, error)
	log  *slog.Logger

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewForwarder returns a Forwarder that reaches peers with dial.
func NewForwarder(dial func(addr string) (*grpc.ClientConn, error), logger *slog.Logger) *Forwarder {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Forwarder{dial: dial, log: logger, conns: map[string]*grpc.ClientConn{}}
}

// Close closes the connections to peers.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for addr, c := range f.conns {
		errs = append(errs, c.Close())
		delete(f.conns, addr)
	}
	return errors.Join(errs...)
}

func (f *Forwarder) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.conns[addr]; ok {
		return c, nil
	}
	c, err := f.dial(addr)
	if err != nil {
		return nil, err
	}
	f.conns[addr] = c
	return c, nil
}

// target returns the owner's address when err says another replica owns
// the session and the call was not forwarded already.
func target(ctx context.Context, err error) (string, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return "", false
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(ForwardedHeader)) > 0 {
		return "", false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == ReasonOwnedElsewhere && info.GetMetadata()["address"] != "" {
			return info.GetMetadata()["address"], true
		}
	}
	return "", false
}

// outgoing carries the caller's metadata (not the transport's) to the
// owner, marked as forwarded; the deadline travels with ctx.
func outgoing(ctx context.Context) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	md := metadata.MD{}
	for k, v := range in {
		switch {
		case strings.HasPrefix(k, ":"), strings.HasPrefix(k, "grpc-"), k == "content-type", k == "user-agent", k == "te":
			continue
		}
		md[k] = append([]string(nil), v...)
	}
	md.Set(ForwardedHeader, "1")
	return metadata.NewOutgoingContext(ctx, md)
}

// newOutput returns an empty response message of a method ("/pkg.Svc/M").
func newOutput(fullMethod string) (proto.Message, error) {
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return nil, fmt.Errorf("cluster: method name %q", fullMethod)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", fullMethod, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok || sd.Methods().ByName(protoreflect.Name(method)) == nil {
		return nil, fmt.Errorf("cluster: %s: no such method", fullMethod)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(sd.Methods().ByName(protoreflect.Name(method)).Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", fullMethod, err)
	}
	return mt.New().Interface(), nil
}

// Unary is the unary server interceptor.
func (f *Forwarder) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		addr, ok := target(ctx, err)
		if !ok {
			return resp, err
		}
		out, oerr := newOutput(info.FullMethod)
		conn, cerr := f.conn(addr)
		if oerr != nil || cerr != nil {
			f.log.Warn("cluster: cannot forward", "method", info.FullMethod, "to", addr, "error", errors.Join(oerr, cerr))
			return nil, err
		}
		var header, trailer metadata.MD
		if err := conn.Invoke(outgoing(ctx), info.FullMethod, req, out, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			return nil, err
		}
		_ = grpc.SetHeader(ctx, header)
		_ = grpc.SetTrailer(ctx, trailer)
		return out, nil
	}
}

// captured records a streaming call's request and whether the local
// handler sent anything.
type captured struct {
	grpc.ServerStream
	req  any
	sent bool
}

func (c *captured) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	if err == nil {
		c.req = m
	}
	return err
}

func (c *captured) SendMsg(m any) error {
	c.sent = true
	return c.ServerStream.SendMsg(m)
}

// Stream is the streaming server interceptor (server-streaming methods).
func (f *Forwarder) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		c := &captured{ServerStream: ss}
		err := handler(srv, c)
		addr, ok := target(ss.Context(), err)
		if !ok || c.sent || c.req == nil || info.IsClientStream {
			return err
		}
		conn, cerr := f.conn(addr)
		if _, oerr := newOutput(info.FullMethod); oerr != nil || cerr != nil {
			f.log.Warn("cluster: cannot forward", "method", info.FullMethod, "to", addr, "error", errors.Join(oerr, cerr))
			return err
		}
		ctx, cancel := context.WithCancel(outgoing(ss.Context()))
		defer cancel()
		cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, info.FullMethod)
		if err != nil {
			return err
		}
		if err := cs.SendMsg(c.req); err != nil {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
		if h, err := cs.Header(); err == nil && len(h) > 0 {
			_ = ss.SetHeader(h)
		}
		for {
			out, _ := newOutput(info.FullMethod)
			if err := cs.RecvMsg(out); err != nil {
				ss.SetTrailer(cs.Trailer())
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if err := ss.SendMsg(out); err != nil {
				return err
			}
		}
	}
}
