package llmgateway

import (
	"context"
	"iter"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// stream runs one validated request through its route's adapter and
// normalises the result: exactly one finish, last, failures in-band.
func (s *Service) stream(ctx context.Context, r *route, req *llmv1.GenerateRequest) iter.Seq[*llmv1.StreamChunk] {
	return provider.Normalize(ctx, s.log, r.name, r.adapter.Stream(ctx, req))
}

// streamMarked is stream with the adapter's boundary markers passed on as
// nil chunks (provider.NormalizeMarked).
func (s *Service) streamMarked(ctx context.Context, r *route, req *llmv1.GenerateRequest) iter.Seq[*llmv1.StreamChunk] {
	return provider.NormalizeMarked(ctx, s.log, r.name, r.adapter.Stream(ctx, req))
}

// MaxBatchBytes bounds the encoded chunks of one batched GenerateResponse:
// a batch that would grow past it is sent first, so a burst (a huge tool
// argument read in one go) still streams in messages of bounded size. A
// single chunk larger than the bound travels alone, as it would unbatched.
const MaxBatchBytes = 32 << 10

// sender sends a Generate stream's chunks. Until the first boundary
// marker each chunk is one response, as it always was; markers reach it
// only when the client set batch_chunks (the handler then reads the marked
// stream). Once the adapter has shown it marks boundaries (provider's
// package doc), the chunks between two markers go in one response
// (`chunks`; a lone chunk still as `chunk`), never held past a marker nor
// grown past MaxBatchBytes; an adapter that marks nothing has each chunk
// sent alone.
type sender struct {
	send   func(*llmv1.GenerateResponse) error
	marked bool // a marker came: the client asked and the adapter marks
	// resp is reused: Send marshals before it returns.
	resp  llmv1.GenerateResponse
	held  []*llmv1.StreamChunk
	bytes int
}

// chunk sends c, or holds it for the batch being built.
func (s *sender) chunk(c *llmv1.StreamChunk) error {
	if !s.marked {
		return s.one(c)
	}
	n := proto.Size(c)
	n += 1 + protowire.SizeVarint(uint64(n)) // the field's tag and length
	if len(s.held) > 0 && s.bytes+n > MaxBatchBytes {
		if err := s.flush(); err != nil {
			return err
		}
	}
	s.held, s.bytes = append(s.held, c), s.bytes+n
	return nil
}

// boundary sends what is held: the adapter is about to wait.
func (s *sender) boundary() error {
	s.marked = true
	return s.flush()
}

// flush sends the held chunks: one as `chunk`, several as a batch.
func (s *sender) flush() error {
	var err error
	switch len(s.held) {
	case 0:
		return nil
	case 1:
		err = s.one(s.held[0])
	default:
		s.resp.Chunk, s.resp.Chunks = nil, s.held
		err = s.send(&s.resp)
		s.resp.Chunks = nil
	}
	clear(s.held)
	s.held, s.bytes = s.held[:0], 0
	return err
}

func (s *sender) one(c *llmv1.StreamChunk) error {
	s.resp.Chunk = c
	err := s.send(&s.resp)
	s.resp.Chunk = nil
	return err
}
