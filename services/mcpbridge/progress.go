package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Progress ordering.
//
// The MCP client hands notifications to a handler goroutine but delivers a
// call's response directly, so a progress notification sent before the
// response can be handled after CallTool returned. To keep "outputs, then the
// result" on the Execute stream, taps count each call's progress
// notifications in wire order (a wrapped stdio connection, an SSE body
// scanner for HTTP) and a call waits, after its response, until the handler
// has forwarded as many as the wire carried.

// drainLimit bounds the wait for late progress, in case a notification is
// counted on the wire but never reaches the handler (a malformed one).
const drainLimit = 5 * time.Second

type progressSink struct {
	out     func(stream, text string)
	mu      sync.Mutex
	seen    int
	handled int
	wake    chan struct{}
}

func (b *Bridge) registerProgress(out func(stream, text string)) (string, *progressSink) {
	s := &progressSink{out: out, wake: make(chan struct{}, 1)}
	tok := "dsh-" + strconv.FormatInt(b.nextTok.Add(1), 10)
	b.progress.Store(tok, s)
	return tok, s
}

// registerProgressToken registers a sink under a given token (tests).
func (b *Bridge) registerProgressToken(tok string) (string, *progressSink) {
	s := &progressSink{out: func(string, string) {}, wake: make(chan struct{}, 1)}
	b.progress.Store(tok, s)
	return tok, s
}

func (b *Bridge) sink(tok any) *progressSink {
	t, _ := tok.(string)
	v, ok := b.progress.Load(t)
	if !ok {
		return nil
	}
	return v.(*progressSink)
}

// sawProgress is called by the taps, in wire order.
func (b *Bridge) sawProgress(tok any) {
	if s := b.sink(tok); s != nil {
		s.mu.Lock()
		s.seen++
		s.mu.Unlock()
	}
}

func (b *Bridge) onProgress(p *mcp.ProgressNotificationParams) {
	s := b.sink(p.ProgressToken)
	if s == nil {
		return
	}
	msg := p.Message
	if msg == "" {
		if p.Total > 0 {
			msg = fmt.Sprintf("%g/%g\n", p.Progress, p.Total)
		} else {
			msg = fmt.Sprintf("%g\n", p.Progress)
		}
	}
	s.out("progress", msg)
	s.mu.Lock()
	s.handled++
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// drain waits until every progress notification seen on the wire for this
// call has been forwarded (or drainLimit passes).
func (s *progressSink) drain(ctx context.Context) {
	timer := time.NewTimer(drainLimit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		done := s.handled >= s.seen
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-s.wake:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// progressToken extracts the token of a notifications/progress message.
func progressToken(m jsonrpc.Message) (any, bool) {
	req, ok := m.(*jsonrpc.Request)
	if !ok || req.IsCall() || req.Method != "notifications/progress" {
		return nil, false
	}
	var p struct {
		ProgressToken any `json:"progressToken"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return nil, false
	}
	return p.ProgressToken, true
}

// tapTransport counts progress notifications as a stdio connection reads them.
type tapTransport struct {
	mcp.Transport
	b *Bridge
}

func (t tapTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return tapConn{Connection: c, b: t.b}, nil
}

type tapConn struct {
	mcp.Connection
	b *Bridge
}

func (c tapConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if err == nil {
		if tok, ok := progressToken(m); ok {
			c.b.sawProgress(tok)
		}
	}
	return m, err
}

// sseTapTransport counts progress notifications in streamable-HTTP SSE
// bodies as the client reads them, and adds configured headers.
type sseTapTransport struct {
	base    http.RoundTripper
	headers map[string]string
	b       *Bridge
}

func (t sseTapTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(t.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range t.headers {
			r.Header.Set(k, v)
		}
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp, err
	}
	resp.Body = &sseTap{ReadCloser: resp.Body, b: t.b}
	return resp, nil
}

type sseTap struct {
	io.ReadCloser
	b       *Bridge
	partial []byte
	data    bytes.Buffer
}

func (s *sseTap) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if n > 0 {
		s.scan(p[:n])
	}
	return n, err
}

func (s *sseTap) scan(chunk []byte) {
	s.partial = append(s.partial, chunk...)
	consumed := 0
	for {
		i := bytes.IndexByte(s.partial[consumed:], '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(s.partial[consumed:consumed+i]), "\r")
		consumed += i + 1
		switch {
		case line == "":
			if s.data.Len() > 0 {
				if m, err := jsonrpc.DecodeMessage(s.data.Bytes()); err == nil {
					if tok, ok := progressToken(m); ok {
						s.b.sawProgress(tok)
					}
				}
				s.data.Reset()
			}
		case strings.HasPrefix(line, "data:"):
			if s.data.Len() > 0 {
				s.data.WriteByte('\n')
			}
			s.data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	s.partial = append(s.partial[:0], s.partial[consumed:]...)
}
