package loop

import (
	"context"
	"errors"
	"fmt"
	"iter"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// LLM makes one model attempt per Generate call and streams its chunks. A
// model-request failure (the provider's, or the transport's to the gateway)
// is reported either as a terminal finish chunk carrying an LlmFailure or as
// an iteration error that wraps *RequestFailure; any other iteration error is
// an ordinary step error. A yielded chunk becomes the session log's (it is
// logged without a copy): the implementation must not mutate it afterwards.
type LLM interface {
	Generate(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error]
}

// BatchLLM is an LLM that can also stream the chunks it received together
// as one batch (the gateway client: the chunks of one gateway response).
// The loop logs one assistant/chunk event per batch; the chunks of an LLM
// without it are logged one per event. A batch, like its chunks, becomes
// the log's and holds no nil chunk.
type BatchLLM interface {
	LLM
	GenerateBatches(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[[]*llmv1.StreamChunk, error]
}

// batches streams one model attempt of llm as batches: its own, or each
// chunk alone.
func batches(ctx context.Context, llm LLM, req *llmv1.GenerateRequest) iter.Seq2[[]*llmv1.StreamChunk, error] {
	if b, ok := llm.(BatchLLM); ok {
		return b.GenerateBatches(ctx, req)
	}
	return func(yield func([]*llmv1.StreamChunk, error) bool) {
		for ch, err := range llm.Generate(ctx, req) {
			if err != nil {
				yield(nil, err)
				return
			}
			if ch == nil {
				continue
			}
			if !yield([]*llmv1.StreamChunk{ch}, nil) {
				return
			}
		}
	}
}

// RequestFailure is a model-request failure surfaced as an error: it carries
// the provider-neutral facts the agent/request-error chain decides on.
type RequestFailure struct {
	Failure *llmv1.LlmFailure
}

func (e *RequestFailure) Error() string {
	if e.Failure == nil {
		return "model request failed"
	}
	return fmt.Sprintf("%s: %s", e.Failure.GetCode(), e.Failure.GetMessage())
}

// Code returns the failure's provider-neutral code.
func (e *RequestFailure) Code() string { return e.Failure.GetCode() }

// AsRequestFailure reports whether err is (or wraps) a model-request failure.
func AsRequestFailure(err error) (*llmv1.LlmFailure, bool) {
	var rf *RequestFailure
	if errors.As(err, &rf) && rf.Failure != nil {
		return rf.Failure, true
	}
	return nil, false
}
