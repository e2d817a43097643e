// Package fakes holds hand-written fakes of the services the agent talks to
// (an LlmGateway that replays scripted chunk sequences, a ToolHost whose tools
// are Go funcs, an AgentHooks server), each served over real loopback gRPC,
// plus builders for scripted model responses. Tests, benchmarks and the crash
// test helper use them; production code never does.
package fakes

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Response is one scripted Generate call.
type Response struct {
	// Wait, when set, is awaited before anything is sent.
	Wait <-chan struct{}
	// Chunks are sent in order.
	Chunks []*llmv1.StreamChunk
	// Batches, when set and the request asked for batches (batch_chunks),
	// groups Chunks: the i-th response carries the next Batches[i] chunks
	// (one as `chunk`, more as `chunks`); chunks past the groups go one
	// per response. Unset, or not asked for: one chunk per response.
	Batches []int
	// Block, when true, holds the stream open after Chunks until the call is
	// cancelled.
	Block bool
	// Err, when set, ends the call with this gRPC status after Chunks.
	Err error
}

// Gateway is a scripted LlmGateway. Calls consume Script in order; when it is
// exhausted, Default answers (or a plain "ok" text when Default is nil).
type Gateway struct {
	llmv1.UnimplementedLlmGatewayServer

	// Providers are the route ids ListProviders reports; default {"fake"}.
	Providers []string
	// Default answers calls past the end of the script.
	Default func(req *llmv1.GenerateRequest) Response
	// Forget keeps no requests (Requests returns none): for a benchmark
	// that measures what the agent holds in the same heap.
	Forget bool
	// Remember answers every request that asks to be remembered as the
	// gateway does when it holds the conversation (the dsh-prefix-id
	// header, a fresh id each), so the client sends the next step as a
	// reference plus the new messages; the fake accepts any reference.
	Remember bool

	ids      atomic.Int64
	mu       sync.Mutex
	script   []Response
	requests []*llmv1.GenerateRequest
}

// Script appends responses to the script.
func (g *Gateway) Script(rs ...Response) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.script = append(g.script, rs...)
}

// Requests returns the requests received so far.
func (g *Gateway) Requests() []*llmv1.GenerateRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*llmv1.GenerateRequest(nil), g.requests...)
}

// Generate replays the next scripted response.
func (g *Gateway) Generate(req *llmv1.GenerateRequest, stream grpc.ServerStreamingServer[llmv1.GenerateResponse]) error {
	g.mu.Lock()
	if !g.Forget {
		g.requests = append(g.requests, req)
	}
	var r Response
	switch {
	case len(g.script) > 0:
		r = g.script[0]
		g.script = g.script[1:]
	case g.Default != nil:
		r = g.Default(req)
	default:
		r = Response{Chunks: Text("ok")}
	}
	g.mu.Unlock()
	ctx := stream.Context()
	if g.Remember && req.GetRememberPrefix() {
		if err := stream.SendHeader(metadata.Pairs("dsh-prefix-id", fmt.Sprintf("p%d", g.ids.Add(1)))); err != nil {
			return err
		}
	}
	if r.Wait != nil {
		select {
		case <-r.Wait:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	chunks := r.Chunks
	if req.GetBatchChunks() {
		for _, n := range r.Batches {
			n = min(n, len(chunks))
			resp := &llmv1.GenerateResponse{Chunks: chunks[:n]}
			if n == 1 {
				resp = &llmv1.GenerateResponse{Chunk: chunks[0]}
			}
			if n > 0 {
				if err := stream.Send(resp); err != nil {
					return err
				}
			}
			chunks = chunks[n:]
		}
	}
	for _, c := range chunks {
		if err := stream.Send(&llmv1.GenerateResponse{Chunk: c}); err != nil {
			return err
		}
	}
	if r.Block {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return r.Err
}

// ListProviders reports the configured routes.
func (g *Gateway) ListProviders(context.Context, *llmv1.ListProvidersRequest) (*llmv1.ListProvidersResponse, error) {
	ids := g.Providers
	if len(ids) == 0 {
		ids = []string{"fake"}
	}
	resp := &llmv1.ListProvidersResponse{}
	for _, id := range ids {
		resp.Providers = append(resp.Providers, &llmv1.ProviderInfo{Id: id, Name: id, Kind: "scripted"})
	}
	return resp, nil
}

// Serve starts a gRPC server on a loopback port with register applied and
// returns its address; the server stops at test cleanup.
func Serve(tb testing.TB, register func(*grpc.Server)) string {
	tb.Helper()
	return ServeWith(tb, nil, register)
}

// Listen starts a gRPC server on addr with register applied. It returns the
// bound address and a stop func.
func Listen(addr string, register func(*grpc.Server)) (string, func(), error) {
	addr, gs, err := ListenWith(addr, nil, register)
	if err != nil {
		return "", nil, err
	}
	return addr, gs.Stop, nil
}

// ListenWith is Listen with server options, returning the server (to stop
// at once or gracefully).
func ListenWith(addr string, opts []grpc.ServerOption, register func(*grpc.Server)) (string, *grpc.Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	gs := grpc.NewServer(opts...)
	register(gs)
	go func() { _ = gs.Serve(lis) }()
	return lis.Addr().String(), gs, nil
}

// Unavailable is a gRPC error a scripted response may end with.
var Unavailable = status.Error(codes.Unavailable, "fake gateway: connection reset")

// ServeWith is Serve with server options.
func ServeWith(tb testing.TB, opts []grpc.ServerOption, register func(*grpc.Server)) string {
	tb.Helper()
	addr, gs, err := ListenWith("127.0.0.1:0", opts, register)
	if err != nil {
		tb.Fatalf("fakes: listen: %v", err)
	}
	tb.Cleanup(gs.Stop)
	return addr
}
