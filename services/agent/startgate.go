package agent

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// startGate lets the agent's gRPC server accept connections while the agent
// is still starting (its store opening, its toolhosts being listed): the
// connection handshakes and the first requests' transport then overlap the
// start instead of following it (docs/arch/throughput.md §33). Every
// AgentService call the edge lets in (authenticated and authorized first)
// waits at the gate until the service is built and runs on it then; a start
// that fails answers the waiting calls, and every later one, UNAVAILABLE
// with the start's error, telling clients not to retry. Nothing runs on a
// half-started agent: a call sees the service only once its store is open
// and its tools are listed, as when the server started serving after the
// start.
type startGate struct {
	done chan struct{} // closed by open or fail
	svc  *Service      // set before done is closed, nil after fail
	err  error         // set before done is closed by fail
}

func newStartGate() *startGate { return &startGate{done: make(chan struct{})} }

// open lets every waiting and later call through to svc.
func (g *startGate) open(svc *Service) {
	g.svc = svc
	close(g.done)
}

// fail answers every waiting and later call with err (the start's error).
func (g *startGate) fail(err error) {
	if err == nil {
		err = errors.New("the start was abandoned")
	}
	g.err = err
	close(g.done)
}

// isOpen reports whether the service is built (the gate open for good).
func (g *startGate) isOpen() bool {
	select {
	case <-g.done:
		return g.err == nil
	default:
		return false
	}
}

// wait returns the built service, or the status a call gets when the start
// failed or the call's ctx ended first. A failed start's status carries the
// trailer grpc-retry-pushback-ms -1: a client retrying UNAVAILABLE (the
// CLI's ClientServiceConfig) stops there and reports the start's error
// instead of retrying into a server that has stopped.
func (g *startGate) wait(ctx context.Context) (*Service, error) {
	select {
	case <-g.done:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if g.err != nil {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "-1"))
		return nil, status.Errorf(codes.Unavailable, "the agent failed to start: %v", g.err)
	}
	return g.svc, nil
}

// lateService is the service a unary call runs on when it arrived before
// the gate opened: the generated handler binds it before the interceptors
// run, and the call's final handler sets Service once the gate has opened.
type lateService struct{ *Service }

// register registers the AgentService on gs with every method's and
// stream's handler waiting at the gate first. The interceptors (the
// edge's authentication and authorization, recovery, metrics) run before
// the wait, as for the service registered directly: a caller the edge
// refuses is refused at once, without waiting for, or learning of, the
// start.
func (g *startGate) register(gs *grpc.Server) {
	desc := agentv1.AgentService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		h := desc.Methods[i].Handler
		desc.Methods[i].Handler = func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			// ic is nil only on a server without unary interceptors,
			// never the agent's (grpcserver and the edge always chain
			// theirs): defensive, the call then waits here, before its
			// request is decoded.
			if g.isOpen() || ic == nil {
				svc, err := g.wait(ctx)
				if err != nil {
					return nil, err
				}
				return h(svc, ctx, dec, ic)
			}
			late := &lateService{}
			wrap := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
				return ic(ctx, req, info, func(ctx context.Context, req any) (any, error) {
					svc, err := g.wait(ctx)
					if err != nil {
						return nil, err
					}
					late.Service = svc
					return next(ctx, req)
				})
			}
			return h(late, ctx, dec, wrap)
		}
	}
	desc.Streams = slices.Clone(desc.Streams)
	for i := range desc.Streams {
		h := desc.Streams[i].Handler
		desc.Streams[i].Handler = func(_ any, ss grpc.ServerStream) error {
			svc, err := g.wait(ss.Context())
			if err != nil {
				return err
			}
			return h(svc, ss)
		}
	}
	// The implementation's type is checked against the service's
	// interface here; the calls get the built one from the gate.
	gs.RegisterService(&desc, (*Service)(nil))
}
