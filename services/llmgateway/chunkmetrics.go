package llmgateway

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	"github.com/dsh-dev/dsh/internal/telemetry"
)

// ChunkCounting is a server option counting the messages the gateway's
// streaming RPCs send (dsh.gateway.chunks; its rate is the chunk rate) on
// mp (nil: the global meter provider, which records only when metrics are
// exported). It wraps the stream, so the chunk path itself is untouched.
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
		s.c.Add(s.ctx, 1)
	}
	return err
}
