// Package upstream sends one streaming HTTP request to a model provider and
// reads its server-sent events under an idle watchdog. It is the only place
// the gateway touches the network.
//
// # Timeouts and cancellation
//
// One cancellable context spans the whole request. The idle watchdog runs
// only while the gateway waits on the provider (the request until its
// response headers, then every read of the body); time the caller spends
// consuming chunks does not count. Expiry cancels the request with cause
// ErrIdle and the failure code is TIMEOUT. Cancelling the caller's context
// cancels the request at once and the code is ABORTED; whichever happens
// first decides.
package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/sse"
)

// DefaultIdleTimeout is the default stall bound.
const DefaultIdleTimeout = 5 * time.Minute

// ErrIdle is the cancellation cause of an idle-watchdog expiry.
var ErrIdle = errors.New("provider stream idle")

// The transport's connection pools. The gateway streams one provider
// request per model call, and under load hundreds of them run at once to the
// same host: every connection that cannot be kept idle after its stream is
// closed, and the next request pays a new dial (and, to a real provider, a
// TLS handshake). net/http keeps only 2 idle connections per host by
// default; 10.4 % of the gateway's CPU at 1,000 sessions was dialling
// (docs/arch/throughput-gateway.md).
const (
	// MaxIdleConnsPerHost bounds the idle connections kept to one provider
	// host: above the number of streams a gateway runs at once to it.
	MaxIdleConnsPerHost = 2048
	// maxIdleConns bounds them over all hosts.
	maxIdleConns = 4096
	// idleConnTimeout closes a connection idle for this long.
	idleConnTimeout = 90 * time.Second
	// writeBufferSize is the per-connection write buffer: a request body
	// (a whole conversation, tens of KiB) goes out in writes this large.
	writeBufferSize = 16 << 10
)

// NewTransport returns the tuned transport shared by a gateway's adapters:
// connection reuse with pools sized for hundreds of concurrent streams per
// host, dial and TLS timeouts, HTTP/2 when the server offers it, no
// transparent compression of event streams.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialContext(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          maxIdleConns,
		MaxIdleConnsPerHost:   MaxIdleConnsPerHost,
		IdleConnTimeout:       idleConnTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		WriteBufferSize:       writeBufferSize,
	}
}

// Client sends provider requests.
type Client struct {
	// HTTP sends the requests; it must not follow a retry policy of its own.
	HTTP *http.Client
	// UserAgent is set on every request.
	UserAgent string
	// IdleTimeout bounds each wait on the provider; DefaultIdleTimeout if 0.
	IdleTimeout time.Duration
	// Now is the clock for Retry-After dates.
	Now func() time.Time
	// Secrets are redacted from every failure message.
	Secrets []string
	// RequestIDHeaders name the response headers carrying the provider's
	// request id, most specific first.
	RequestIDHeaders []string
	// ErrorDetail extracts a message from an error body; nil uses the
	// OpenAI-style {"error":{"message"}} shape.
	ErrorDetail func(body []byte) (kind, message string)
}

// Request is one provider call.
type Request struct {
	// Name labels the provider in failure messages ("deepseek").
	Name   string
	URL    string
	Header http.Header
	// Body is the request body: the concatenation of its parts, sent as
	// they are (none is copied into a joined buffer first; see
	// partsReader). The parts must not be modified.
	Body [][]byte
}

// Stream is an open provider response body read as events.
type Stream struct {
	c         *Client
	name      string
	ctx       context.Context
	parent    context.Context
	cancel    context.CancelCauseFunc
	wd        *watchdog
	body      io.ReadCloser
	events    *sse.Reader
	requestID string
	em        *provider.Emitter
	// ended: the provider's end marker was read (End); from then on the
	// caller's end no longer cancels the request (see Open).
	ended   atomic.Bool
	unwatch func() bool
	// eof: a read of the body returned io.EOF (its terminator was read,
	// and net/http has put the connection back in its pool).
	eof bool
	// drained is closed when Close has released the response (after the
	// background drain, if any).
	drained chan struct{}
}

// drainBytes and drainTimeout bound the read of what follows a stream's
// end marker after Close: the body's terminator, which lets the connection
// go back to the pool (a body closed before its EOF closes the connection).
const (
	drainBytes   = 4 << 10
	drainTimeout = time.Second
)

// End records that the provider sent its end marker: Close then reads the
// rest of the body (its terminator) in the background so that the
// connection is kept for the next request.
func (s *Stream) End() { s.ended.Store(true) }

// Coalesce makes e's merged deltas leave whenever the stream is about to
// wait for the provider (before each read of the body the event reader
// cannot serve from its buffer), and bytes e holds back leave after
// provider.MaxHold of silence.
func (s *Stream) Coalesce(e *provider.Emitter) {
	e.Coalesce()
	s.em = e
}

// Open sends r and returns the event stream of a 2xx response, or the
// failure: TRANSPORT, TIMEOUT, ABORTED, or the classified HTTP status.
func (c *Client) Open(ctx context.Context, r Request) (*Stream, *provider.Failure) {
	idle := c.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	// The request outlives its caller only to drain a finished body: the
	// caller's end (a gRPC stream's context ends as its handler returns,
	// right after Close) cancels it unless the provider's end marker was
	// read, so Close's drain can still return the connection to the pool.
	cctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	s := &Stream{c: c, name: r.Name, ctx: cctx, parent: ctx, cancel: cancel}
	s.unwatch = context.AfterFunc(ctx, func() {
		if !s.ended.Load() {
			cancel(context.Cause(ctx))
		}
	})
	s.wd = newWatchdog(idle, func() { cancel(ErrIdle) })
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, r.URL, nil)
	if err != nil {
		s.close()
		return nil, &provider.Failure{Code: provider.CodeInvalidRequest, Message: fmt.Sprintf("%s: bad request URL: %v", r.Name, c.redact(err.Error()))}
	}
	setBody(req, r.Body)
	for k, v := range r.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("User-Agent", c.UserAgent)
	s.wd.arm()
	resp, err := c.HTTP.Do(req)
	s.wd.disarm()
	if err != nil {
		f := s.failure(err, provider.CodeTransport, "no response")
		s.close()
		return nil, f
	}
	s.body = resp.Body
	s.requestID = c.requestID(resp.Header)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s.wd.arm()
		body, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		s.wd.disarm()
		if rerr != nil && s.ctx.Err() != nil {
			f := s.failure(rerr, provider.CodeTransport, "reading the error response")
			s.close()
			return nil, f
		}
		kind, msg := c.detail(body)
		if msg == "" {
			msg = strings.TrimSpace(string(body))
			if len(msg) > 500 {
				msg = msg[:500] + "…"
			}
		}
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		now := time.Now
		if c.Now != nil {
			now = c.Now
		}
		f := &provider.Failure{
			Code:       provider.ClassifyHTTP(resp.StatusCode, kind+" "+msg),
			Message:    c.redact(fmt.Sprintf("%s HTTP %d: %s", r.Name, resp.StatusCode, msg)),
			Status:     resp.StatusCode,
			RetryAfter: provider.RetryAfter(resp.Header, now()),
			RequestID:  s.requestID,
		}
		s.close()
		return nil, f
	}
	s.events = sse.NewReader(watchedReader{r: resp.Body, wd: s.wd, s: s})
	return s, nil
}

// Next returns the next event. Its error is a *provider.Failure: io.EOF
// becomes STREAM_CLOSED (the caller checks for its end marker first), a
// read error TRANSPORT (or TIMEOUT / ABORTED by the cancellation cause).
func (s *Stream) Next() (sse.Event, *provider.Failure) {
	ev, err := s.events.Next()
	if err == nil {
		return ev, nil
	}
	if errors.Is(err, io.EOF) && s.ctx.Err() == nil {
		return ev, s.Fail(provider.CodeStreamClosed, "the stream ended without its end marker")
	}
	if errors.Is(err, sse.ErrEventTooLarge) {
		return ev, s.Fail(provider.CodeMalformedResponse, err.Error())
	}
	return ev, s.failure(err, provider.CodeTransport, "connection lost mid-stream")
}

// Fail builds a failure carrying the stream's request id.
func (s *Stream) Fail(code, msg string) *provider.Failure {
	return &provider.Failure{Code: code, Message: s.c.redact(s.name + ": " + msg), RequestID: s.requestID}
}

// RequestID is the provider's request id from the response headers.
func (s *Stream) RequestID() string { return s.requestID }

// Close releases the response and cancels the request. After End it
// first reads the body to its end (at most drainBytes, for at most
// drainTimeout) on another goroutine, so that the connection returns to
// the pool without delaying the caller: the terminator may still be on
// its way when the end marker was read. When the body's terminator was
// already read with the end marker (the usual case: a provider writes it
// right after the marker), the connection is already back in the pool and
// no goroutine is started.
func (s *Stream) Close() {
	s.drained = make(chan struct{})
	if !s.ended.Load() || s.eof || s.body == nil || s.ctx.Err() != nil {
		s.close()
		close(s.drained)
		return
	}
	s.wd.stop()
	go func() {
		defer close(s.drained)
		t := time.AfterFunc(drainTimeout, func() { s.cancel(context.Canceled) })
		_, _ = io.Copy(io.Discard, io.LimitReader(s.body, drainBytes))
		t.Stop()
		s.close()
	}()
}

func (s *Stream) close() {
	s.wd.stop()
	s.unwatch()
	s.cancel(context.Canceled)
	if s.body != nil {
		_ = s.body.Close()
	}
	if s.events != nil {
		s.events.Release() // no read of the body is running: it was closed
	}
}

// failure classifies err by the cancellation cause first.
func (s *Stream) failure(err error, code, what string) *provider.Failure {
	switch {
	case errors.Is(context.Cause(s.ctx), ErrIdle):
		return &provider.Failure{Code: provider.CodeTimeout, Message: fmt.Sprintf("%s: no data from the provider for %s", s.name, s.wd.d), RequestID: s.requestID}
	case s.parent.Err() != nil:
		return &provider.Failure{Code: provider.CodeAborted, Message: "the caller cancelled the request", RequestID: s.requestID}
	}
	return &provider.Failure{Code: code, Message: s.c.redact(fmt.Sprintf("%s: %s: %v", s.name, what, err)), RequestID: s.requestID}
}

func (c *Client) redact(s string) string { return provider.Redact(s, c.Secrets...) }

func (c *Client) requestID(h http.Header) string {
	for _, k := range c.RequestIDHeaders {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return ""
}

func (c *Client) detail(body []byte) (string, string) {
	if c.ErrorDetail != nil {
		return c.ErrorDetail(body)
	}
	return OpenAIErrorDetail(body)
}

// OpenAIErrorDetail reads {"error":{"message","type","code"}} (or a bare
// {"message"} / {"error":"text"}).
func OpenAIErrorDetail(body []byte) (kind, message string) {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &v) != nil {
		return "", ""
	}
	var e struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if len(v.Error) > 0 && json.Unmarshal(v.Error, &e) == nil {
		code := strings.Trim(string(e.Code), `"`)
		if code == "null" {
			code = ""
		}
		return strings.TrimSpace(e.Type + " " + code), e.Message
	}
	var s string
	if len(v.Error) > 0 && json.Unmarshal(v.Error, &s) == nil {
		return "", s
	}
	return "", v.Message
}

// watchdog cancels the request when armed longer than d. A timer callback
// that raced with a re-arm checks the deadline and re-schedules itself.
type watchdog struct {
	d        time.Duration
	mu       sync.Mutex
	t        *time.Timer
	fire     func()
	armed    bool
	deadline time.Time
}

func newWatchdog(d time.Duration, fire func()) *watchdog {
	w := &watchdog{d: d, fire: fire}
	w.t = time.AfterFunc(time.Hour, w.expire)
	w.t.Stop()
	return w
}

func (w *watchdog) expire() {
	w.mu.Lock()
	if !w.armed {
		w.mu.Unlock()
		return
	}
	if left := time.Until(w.deadline); left > 0 {
		w.t.Reset(left)
		w.mu.Unlock()
		return
	}
	w.armed = false
	w.mu.Unlock()
	w.fire()
}

func (w *watchdog) arm() {
	w.mu.Lock()
	w.armed = true
	w.deadline = time.Now().Add(w.d)
	w.t.Reset(w.d)
	w.mu.Unlock()
}

func (w *watchdog) disarm() {
	w.mu.Lock()
	w.armed = false
	w.t.Stop()
	w.mu.Unlock()
}

func (w *watchdog) stop() { w.disarm() }

// errConsumerGone ends a read when the consumer of the chunks stopped.
var errConsumerGone = errors.New("the consumer stopped reading chunks")

// watchedReader arms the watchdog around every read of the body, after
// flushing the stream's emitter (everything already read has been
// translated, and the next bytes may take a while).
type watchedReader struct {
	r  io.Reader
	wd *watchdog
	s  *Stream
}

func (w watchedReader) Read(p []byte) (n int, err error) {
	if w.s != nil {
		defer func() {
			if err == io.EOF {
				w.s.eof = true
			}
		}()
	}
	if w.s != nil && w.s.em != nil {
		if !w.s.em.Flush() {
			return 0, errConsumerGone
		}
		if w.s.em.Held() {
			return w.readHolding(p)
		}
	}
	w.wd.arm()
	n, err = w.r.Read(p)
	w.wd.disarm()
	return n, err
}

// readHolding reads while the emitter holds bytes back: the read runs on
// its own goroutine so that, if the provider stays quiet for
// provider.MaxHold, the held bytes are sent from this one (the emitter's
// owner) while the read goes on. Only a block past the growth bound with a
// small tail takes this path.
func (w watchedReader) readHolding(p []byte) (int, error) {
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	w.wd.arm()
	go func() {
		n, err := w.r.Read(p)
		done <- result{n, err}
	}()
	t := time.NewTimer(provider.MaxHold)
	defer t.Stop()
	var r result
	select {
	case r = <-done:
	case <-t.C:
		w.wd.disarm() // a slow consumer is not a quiet provider
		if !w.s.em.FlushHeld() {
			w.s.cancel(errConsumerGone) // ends the read
		}
		w.wd.arm()
		r = <-done
	}
	w.wd.disarm()
	return r.n, r.err
}
