package llmgateway

import (
	"context"
	"iter"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// stream runs one validated request through its route's adapter and
// normalises the result: exactly one finish, last, failures in-band.
func (s *Service) stream(ctx context.Context, r *route, req *llmv1.GenerateRequest) iter.Seq[*llmv1.StreamChunk] {
	return provider.Normalize(ctx, s.log, r.name, r.adapter.Stream(ctx, req))
}
