package upstream

import (
	"context"
	"iter"
	"log/slog"
	"net/http"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// Call is one streamed provider call of an HTTP adapter: what differs
// between adapters (the body, the headers, the event translation) around
// the steps they share.
type Call struct {
	// Route names the provider route, for failures and logs.
	Route string
	// URL is the endpoint.
	URL string
	// Header holds the adapter's headers (auth, version, markers).
	Header http.Header
	// Logger receives the dropped-blocks line.
	Logger *slog.Logger
	// Body builds the request body (the concatenation of its parts: see
	// Request.Body) and counts the blocks the wire format cannot carry
	// (they are dropped, never sent as garbage).
	Body func() (body [][]byte, dropped int, err error)
	// Translate folds the provider's events into chunks.
	Translate func(*Stream, *provider.Emitter)
}

// Stream runs c as one provider attempt: a body that cannot be built is an
// INVALID_REQUEST failure, dropped blocks are counted in a log line, and the
// opened stream is translated (coalescing deltas, see provider.Emitter) and
// closed.
func (cl *Client) Stream(ctx context.Context, c Call) iter.Seq2[*llmv1.StreamChunk, error] {
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		body, dropped, err := c.Body()
		if err != nil {
			yield(nil, &provider.Failure{Code: provider.CodeInvalidRequest, Message: c.Route + ": " + err.Error()})
			return
		}
		if dropped > 0 {
			c.Logger.Info("dropped blocks the wire format cannot carry", "route", c.Route, "blocks", dropped)
		}
		s, f := cl.Open(ctx, Request{Name: c.Route, URL: c.URL, Header: c.Header, Body: body})
		if f != nil {
			yield(nil, f)
			return
		}
		defer s.Close()
		// Deltas already read are merged into one chunk; they go out before
		// the stream waits for the provider again.
		e := provider.NewEmitter(yield)
		s.Coalesce(e)
		c.Translate(s, e)
	}
}
