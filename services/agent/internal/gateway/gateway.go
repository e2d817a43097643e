// Package gateway adapts the dsh.llm.v1.LlmGateway gRPC client to the loop's
// LLM seam: one Generate call is one provider attempt, streamed as an
// iter.Seq2 of chunks. gRPC failures of the call itself (the gateway down, a
// deadline, a request the gateway refuses) become *loop.RequestFailure errors
// with provider-neutral codes so the agent/request-error chain can decide on
// them; a stream that ends without its terminal finish chunk becomes
// STREAM_CLOSED.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// Client is the LlmGateway client adapter.
type Client struct {
	c      llmv1.LlmGatewayClient
	codec  *historyCodec
	misses atomic.Int64
	// wholeUntil is when (Unix nanoseconds) the client may send
	// references again after a gateway refused one as invalid (a gateway
	// that predates them: a replica of an older version).
	wholeUntil atomic.Int64
	now        func() time.Time
}

// refusedBackoff is how long a client sends every request whole after a
// gateway refused a reference as invalid but took the whole request: long
// enough that a mixed-version rollout does not pay a refusal per step,
// short enough that references resume soon after it ends.
const refusedBackoff = 5 * time.Minute

var _ loop.BatchLLM = (*Client)(nil)

// New wraps a connection to an LlmGateway.
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{c: llmv1.NewLlmGatewayClient(conn), codec: newHistoryCodec(), now: time.Now}
}

// Generate streams one model attempt. Breaking out of the iteration cancels
// the call.
//
// A step of a session's conversation names the conversation the gateway
// remembered for the session's previous step and sends only the messages
// after it (GenerateRequest.prefix, docs/API.md). When the gateway does not
// hold it (restarted, another replica, evicted) it answers
// FAILED_PRECONDITION PREFIX_NOT_CACHED before anything reaches the
// provider and before any chunk, and the whole request is sent again here:
// the caller sees one attempt either way. A gateway that predates
// references refuses one INVALID_ARGUMENT (it sees no messages: the new
// ones travel in `continued`); that is a miss too, and when the whole
// request is then accepted (a chunk streams) the client sends every
// request whole for refusedBackoff (a mixed-version rollout would refuse
// again). A request sent whole is never sent twice.
//
// Every request asks for batched responses (GenerateRequest.batch_chunks:
// the chunks the gateway produced from one read of its provider in one
// message, fewer messages to receive); Generate yields a batch chunk by
// chunk, exactly as the same chunks one per response, which is what a
// gateway that predates batches sends, and GenerateBatches yields it whole.
//
// Every call of a session carries the session's id in the SessionHeader
// metadata, so a connection dialled with grpcserver.SessionAffinity on it
// sends all of a session's steps to the same gateway replica, the one that
// remembers the conversation.
func (c *Client) Generate(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		for batch, err := range c.GenerateBatches(ctx, req) {
			if err != nil {
				yield(nil, err)
				return
			}
			for _, ch := range batch {
				if !yield(ch, nil) {
					return
				}
			}
		}
	}
}

// GenerateBatches is Generate with the chunks of one gateway response
// yielded together, in order (a batch of one from a gateway that predates
// batches); the loop logs one assistant/chunk event per batch. A batch
// holds no nil chunk and, like the chunks, becomes the caller's.
func (c *Client) GenerateBatches(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[[]*llmv1.StreamChunk, error] {
	return func(yield func([]*llmv1.StreamChunk, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if id := req.GetSessionId(); id != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, SessionHeader, id)
		}
		full := c.now().UnixNano() < c.wholeUntil.Load()
		switch c.attempt(ctx, req, full, yield) {
		case notHeld:
			c.attempt(ctx, req, true, yield)
		case refused:
			if c.attempt(ctx, req, true, yield) == accepted {
				c.wholeUntil.Store(c.now().Add(refusedBackoff).UnixNano())
			}
		}
	}
}

// outcome is how an attempt ended, as far as a resend is concerned.
type outcome int

const (
	failed   outcome = iota // an error yielded before any chunk
	accepted                // at least one chunk streamed (whatever came after, yielded)
	notHeld                 // a reference the gateway does not hold: nothing yielded
	refused                 // INVALID_ARGUMENT before any chunk of a reference: nothing yielded
)

// attempt makes one Generate call and yields what it streams. It yields
// nothing when the gateway refused the reference the request went out as
// (notHeld, refused), so the whole request can be sent; every other end
// is yielded (failed, accepted) and ends the call.
func (c *Client) attempt(ctx context.Context, req *llmv1.GenerateRequest, full bool, yield func([]*llmv1.StreamChunk, error) bool) outcome {
	cc := &callCodec{historyCodec: c.codec, full: full}
	stream, err := c.c.Generate(ctx, req, grpc.ForceCodecV2(cc))
	if err != nil {
		yield(nil, classify(err))
		return failed
	}
	referenced := cc.referenced.Load()
	if conversation(req) {
		// The header comes before the first chunk (the gateway sends it
		// when it accepted the request); an error here surfaces from
		// Recv, and Header then returns no metadata.
		if md, _ := stream.Header(); md != nil {
			id := ""
			if v := md.Get(prefixHeader); len(v) == 1 {
				id = v[0]
			}
			c.codec.held(req, id, int(cc.histBytes.Load()), c.now().UnixNano() < c.wholeUntil.Load())
		}
	}
	finished, got := false, false
	// One response wrapper for the whole stream: each RecvMsg resets it
	// and gives it a new chunks slice, never reusing the old one
	// (historyCodec.Unmarshal: decodeResponse and, for what it declines,
	// proto.Unmarshal each Reset it and make a new chunks slice), so the
	// chunks it held and the batch slice itself (yielded, now the log's:
	// AssistantChunk.chunks) are left alone. A codec that pooled or merged
	// into the old slice would overwrite logged events.
	resp := &llmv1.GenerateResponse{}
	for {
		err := stream.RecvMsg(resp)
		if errors.Is(err, io.EOF) {
			if !finished {
				yield(nil, &loop.RequestFailure{Failure: &llmv1.LlmFailure{
					Code: "STREAM_CLOSED", Message: "gateway stream ended without a finish chunk"}})
			}
			return ended(got)
		}
		if err != nil {
			invalid := !got && status.Code(err) == codes.InvalidArgument
			if referenced && !got && (invalid || prefixMiss(err)) {
				c.codec.held(req, "", 0, false)
				c.misses.Add(1)
				if invalid {
					return refused
				}
				return notHeld
			}
			yield(nil, classify(err))
			return ended(got)
		}
		// A response holds one chunk, or a batch (the request asks for
		// them, batchField): either is yielded as the batch it came in.
		batch := resp.GetChunks()
		if ch := resp.GetChunk(); ch != nil {
			batch = append([]*llmv1.StreamChunk{ch}, batch...)
		}
		batch = slices.DeleteFunc(batch, func(ch *llmv1.StreamChunk) bool { return ch == nil })
		if len(batch) == 0 {
			continue
		}
		got = true
		if slices.ContainsFunc(batch, func(ch *llmv1.StreamChunk) bool { return ch.GetFinish() != nil }) {
			finished = true
		}
		if !yield(batch, nil) {
			return accepted
		}
	}
}

// ended is how an attempt that yielded its end ended.
func ended(got bool) outcome {
	if got {
		return accepted
	}
	return failed
}

// SessionHeader is the request metadata naming the session a Generate call
// belongs to: the agent's gateway connection hashes it to pick a replica
// (grpcserver.SessionAffinity). The gateway does not read it.
const SessionHeader = "dsh-session-id"

// The remembered-conversation protocol (docs/API.md; the gateway's
// llmgateway.PrefixHeader and ReasonPrefixNotCached).
const (
	prefixHeader          = "dsh-prefix-id"
	reasonPrefixNotCached = "PREFIX_NOT_CACHED"
)

// prefixMiss reports whether err is the gateway's answer to a conversation
// reference it does not hold.
func prefixMiss(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reasonPrefixNotCached {
			return true
		}
	}
	return false
}

// PrefixMisses counts the references the gateway refused (PREFIX_NOT_CACHED,
// or INVALID_ARGUMENT from a gateway that predates them); each request was
// sent again whole.
func (c *Client) PrefixMisses() int64 { return c.misses.Load() }

// ListProviders returns the gateway's provider route ids.
func (c *Client) ListProviders(ctx context.Context) ([]string, error) {
	resp, err := c.c.ListProviders(ctx, &llmv1.ListProvidersRequest{})
	if err != nil {
		return nil, fmt.Errorf("gateway list providers: %w", err)
	}
	ids := make([]string, 0, len(resp.GetProviders()))
	for _, p := range resp.GetProviders() {
		ids = append(ids, p.GetId())
	}
	return ids, nil
}

// classify maps a gRPC error of a Generate call to a model-request failure.
func classify(err error) error {
	st, _ := status.FromError(err)
	code := "UNKNOWN"
	switch st.Code() {
	case codes.Canceled:
		code = "ABORTED"
	case codes.DeadlineExceeded:
		code = "TIMEOUT"
	case codes.Unavailable:
		code = "TRANSPORT"
	case codes.InvalidArgument:
		code = "INVALID_REQUEST"
	case codes.NotFound:
		code = "NO_ADAPTER"
	case codes.Unauthenticated, codes.PermissionDenied:
		code = "AUTH"
	case codes.ResourceExhausted:
		// gRPC's own message-size limit is not a rate limit: retrying the
		// same request cannot succeed.
		code = "RATE_LIMIT"
		if strings.Contains(st.Message(), "larger than max") {
			code = "REQUEST_TOO_LARGE"
		}
	case codes.Internal, codes.Unknown:
		code = "SERVER"
	}
	msg := st.Message()
	if msg == "" {
		msg = err.Error()
	}
	return &loop.RequestFailure{Failure: &llmv1.LlmFailure{Code: code, Message: "gateway: " + msg}}
}

// EncodeStats reports the history bytes of every request so far: encoded
// afresh, and reused from the per-session cache (a compaction re-encodes
// only from the replaced position on).
func (c *Client) EncodeStats() (encoded, reused int64) {
	return c.codec.encoded.Load(), c.codec.reused.Load()
}

// ReferredBytes reports the history bytes not sent because the gateway held
// them (named by GenerateRequest.prefix instead).
func (c *Client) ReferredBytes() int64 { return c.codec.referred.Load() }

// Forget drops the per-session encoding cache of a session that left memory.
func (c *Client) Forget(sessionID string) { c.codec.forget(sessionID) }

// ModelContext returns a route and model's context window and compaction
// overrides (nil when the gateway knows neither).
func (c *Client) ModelContext(ctx context.Context, provider, model string) (*llmv1.ModelContext, error) {
	resp, err := c.c.GetModelContext(ctx, &llmv1.GetModelContextRequest{Provider: provider, Model: model})
	if err != nil {
		return nil, fmt.Errorf("gateway model context of %s/%s: %w", provider, model, err)
	}
	return resp.GetContext(), nil
}
