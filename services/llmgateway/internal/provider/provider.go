// Package provider is the gateway's model-provider seam: the Adapter
// interface every provider implementation satisfies, the routes that select
// adapters, the provider-neutral Failure, and the small helpers every adapter
// shares (the chunk Emitter, failure classification, the User-Agent).
//
// # Ordering
//
// An adapter's Stream yields StreamChunks in the grammar of the design notes
// (§2.2–§2.4): block-start, deltas and block-end per block, usage at most once,
// then exactly one finish, nothing after it. An adapter may instead end its
// sequence by yielding an error (transport and protocol failures); Normalize
// turns either path into the one shape the gateway serves: every stream ends
// with exactly one finish chunk, failures as finish{error|aborted, LlmFailure},
// and no block is left open.
//
// # Boundaries
//
// An adapter may yield a nil chunk with a nil error: a boundary marker
// (Emitter.Boundary; the emitter yields one at every Flush). It says that
// the chunks yielded since the previous marker were produced from input the
// adapter had already read and that it is about to wait for its provider.
// An adapter that yields one must yield one before every wait that follows
// a chunk (the end of the sequence counts as one); the gateway then sends
// the chunks between two markers in one gRPC message when the client asked
// for batches (GenerateRequest.batch_chunks), and never holds a chunk past
// a marker. An adapter that yields none has each chunk sent on its own.
// Normalize drops the markers; NormalizeMarked passes them on.
package provider

import (
	"context"
	"iter"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Adapter serves one provider wire format. One adapter instance may serve
// several routes; it must be safe for concurrent use.
type Adapter interface {
	// Kind names the adapter kind: deepseek, openai, anthropic, scripted.
	Kind() string
	// Models is the advisory catalogue; unlisted model ids are still accepted.
	Models() []Model
	// Validate rejects, before anything is sent, a request this adapter
	// cannot express (an image block to a route without vision). It returns
	// a *RequestError naming the offending block.
	Validate(req *llmv1.GenerateRequest) error
	// Stream makes exactly one provider attempt (never a retry) and yields
	// its chunks. It honours ctx: cancelling ctx cancels the upstream request
	// at once. The sequence ends with a finish chunk or with an error.
	Stream(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error]
}

// ModelFetcher is implemented by adapters that can ask their server which
// models it serves; the gateway uses it for a route configured without a
// catalogue.
type ModelFetcher interface {
	FetchModels(ctx context.Context) ([]Model, error)
}

// Model is one catalogue entry of a route.
type Model struct {
	// ID is the provider model id.
	ID string `json:"id"`
	// Name is a human-readable name; the id when empty.
	Name string `json:"name,omitempty"`
	// Description optionally tells similar models apart.
	Description string `json:"description,omitempty"`
	// ContextWindow is the maximum combined request and response tokens;
	// zero means unknown.
	ContextWindow int64 `json:"context_window,omitempty"`
}

// RequestError reports a request that is itself wrong (the gateway answers
// it with INVALID_ARGUMENT before anything is sent upstream).
type RequestError struct {
	// Field is the path of the offending field, e.g. "messages[2].content[1]".
	Field string
	// Reason says what is wrong in words a person can act on.
	Reason string
}

func (e *RequestError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Code is the stable error code.
func (e *RequestError) Code() string { return "INVALID_REQUEST" }

// AppIdentity is the static public identity every provider request carries
// in its User-Agent. It holds no secrets and nothing per request.
type AppIdentity struct {
	Product string
	Version string
	URL     string
}

// DSH is dsh's identity at the given version ("dev" when empty).
func DSH(version string) AppIdentity {
	if version == "" {
		version = "dev"
	}
	return AppIdentity{Product: "dsh", Version: version, URL: "https://github.com/dsh-dev/dsh"}
}

// UserAgent renders the identity as "dsh/<version> (+<url>)".
func (a AppIdentity) UserAgent() string {
	p, v, u := a.Product, a.Version, a.URL
	if p == "" {
		p = "dsh"
	}
	if v == "" {
		v = "dev"
	}
	if u == "" {
		return p + "/" + v
	}
	return p + "/" + v + " (+" + u + ")"
}

// BodyPrefix is an adapter's encoding of the first N messages of a
// conversation, kept beside the gateway's remembered conversation
// (package prefix) so that the request continuing it encodes only the
// messages after them. Owner is the adapter that made it: a body is
// reused only by its owner. The encoding is the concatenation of
// Segments (a continued conversation's are its predecessor's and the new
// messages', so that no request copies what an earlier one encoded, except
// when chat.compact copies them into one buffer: past maxSegments parts, or
// from minWasteSegments parts holding more than twice their bytes); they
// must not be modified.
type BodyPrefix struct {
	Owner    any
	N        int
	Segments [][]byte
	// Dropped is how many blocks the first N messages dropped.
	Dropped int
	// Held is how many bytes keeping Segments (and ToolBytes) keeps alive
	// (they may be slices of larger buffers, whole request bodies:
	// counting only their lengths would make the cache's bound untrue); 0
	// means their lengths.
	Held int
	// Tools are the tool schemas whose encoding is ToolBytes (the
	// request's own, immutable like the remembered conversation's): a
	// request continuing this one with the very same schemas (the same
	// pointers, in the same order: GenerateRequest.prefix.same_tools)
	// reuses ToolBytes instead of encoding them again. ToolBytes must not
	// be modified.
	Tools     []*llmv1.ToolSchema
	ToolBytes []byte
}

// SameTools reports whether tools are the very schemas p's ToolBytes
// encode: the same pointers in the same order (not equal contents: a
// remembered conversation's schemas are immutable, so the same pointer is
// the same schema, and the check costs a pointer comparison per tool).
func (p *BodyPrefix) SameTools(tools []*llmv1.ToolSchema) bool {
	if len(tools) == 0 || len(tools) != len(p.Tools) || len(p.ToolBytes) == 0 {
		return false
	}
	for i, t := range tools {
		if t != p.Tools[i] {
			return false
		}
	}
	return true
}

// Len is the length of p's encoding of its messages.
func (p *BodyPrefix) Len() int {
	n := 0
	for _, s := range p.Segments {
		n += len(s)
	}
	return n
}

// HeldBytes is how many bytes keeping p keeps alive.
func (p *BodyPrefix) HeldBytes() int {
	return max(p.Held, p.Len()+len(p.ToolBytes))
}

// BodyCache is the slot of one request's remembered conversation: Prev is
// the body kept for the conversation the request continues (nil when
// none); Keep hands over the body of this request's messages for the next.
type BodyCache interface {
	Prev() *BodyPrefix
	Keep(*BodyPrefix)
}

type bodyCacheKey struct{}

// WithBodyCache returns ctx carrying bc for the adapter's Stream.
func WithBodyCache(ctx context.Context, bc BodyCache) context.Context {
	return context.WithValue(ctx, bodyCacheKey{}, bc)
}

// BodyCacheFrom returns the body cache ctx carries, or nil.
func BodyCacheFrom(ctx context.Context) BodyCache {
	bc, _ := ctx.Value(bodyCacheKey{}).(BodyCache)
	return bc
}
