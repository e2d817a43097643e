package llmgateway

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// ChunkCounting is a server option counting the chunks the gateway's
// streaming RPCs send (dsh.gateway.chunks; its rate is the chunk rate: a
// batched GenerateResponse counts its chunks, not 1) on mp (nil: the global
// meter provider, which records only when metrics are exported). It wraps
// the stream, so the chunk path itself is untouched.
func ChunkCounting(mp metric.MeterProvider) grpc.ServerOption {
	c, err := telemetry.NewChunkCounter(mp)
	if err != nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, &countingStream{ServerStream: ss, ctx: ss.Context(), c: c})
	})
}

type countingStream struct {
	grpc.ServerStream
	ctx context.Context
	c   metric.Int64Counter
}

func (s *countingStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.c.Add(s.ctx, int64(chunksIn(m)))
	}
	return err
}

// chunksIn is how many chunks message m carries.
func chunksIn(m any) int {
	r, ok := m.(*llmv1.GenerateResponse)
	if !ok || len(r.GetChunks()) == 0 {
		return 1
	}
	n := len(r.GetChunks())
	if r.GetChunk() != nil {
		n++
	}
	return n
}
