// Package providertest is the conformance suite every provider adapter runs
// (Run), plus the helpers adapter tests share: an upstream HTTP server that
// replays captured SSE bytes with faults (split writes, stalls, connection
// resets), stream collection through provider.Normalize with the strict
// grammar check, and golden files of chunk sequences.
//
// Set DSH_UPDATE_GOLDEN=1 to rewrite golden files.
package providertest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// Reply is what the fake upstream answers.
type Reply struct {
	// Status is the HTTP status; 200 when zero.
	Status int
	// Header holds response headers.
	Header map[string]string
	// Body is written as is (captured SSE bytes, or an error JSON).
	Body []byte
	// Chunk writes and flushes the body in pieces of this many bytes
	// (splitting events, lines, UTF-8 sequences); whole body when zero.
	Chunk int
	// ResetAfter, when > 0, writes that many bytes, then hijacks the
	// connection and closes it (a connection reset mid-stream).
	ResetAfter int
	// StallAfter, when > 0, writes that many bytes, then stalls until the
	// request is cancelled.
	StallAfter int
	// StallHeaders stalls before sending the response headers until the
	// request is cancelled.
	StallHeaders bool
}

// Upstream is a fake provider endpoint.
type Upstream struct {
	URL string
	mu  sync.Mutex
	// requests seen, in order.
	reqs      []Seen
	cancelled chan struct{}
	once      sync.Once
}

// Seen is one request the upstream received.
type Seen struct {
	Path   string
	Header http.Header
	Body   []byte
}

// Serve starts an upstream answering every request with r.
func Serve(t testing.TB, r Reply) *Upstream {
	t.Helper()
	u := &Upstream{cancelled: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, Seen{Path: req.URL.Path, Header: req.Header.Clone(), Body: body})
		u.mu.Unlock()
		if r.StallHeaders {
			<-req.Context().Done()
			u.once.Do(func() { close(u.cancelled) })
			return
		}
		for k, v := range r.Header {
			w.Header().Set(k, v)
		}
		if w.Header().Get("Content-Type") == "" {
			if r.Status == 0 || r.Status == 200 {
				w.Header().Set("Content-Type", "text/event-stream")
			} else {
				w.Header().Set("Content-Type", "application/json")
			}
		}
		status := r.Status
		if status == 0 {
			status = http.StatusOK
		}
		w.WriteHeader(status)
		fl := w.(http.Flusher)
		data := r.Body
		limit := len(data)
		if r.ResetAfter > 0 {
			limit = min(limit, r.ResetAfter)
		}
		if r.StallAfter > 0 {
			limit = min(limit, r.StallAfter)
		}
		step := r.Chunk
		if step <= 0 {
			step = len(data) + 1
		}
		for i := 0; i < limit; i += step {
			_, _ = w.Write(data[i:min(i+step, limit)])
			fl.Flush()
		}
		switch {
		case r.ResetAfter > 0:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		case r.StallAfter > 0:
			<-req.Context().Done()
			u.once.Do(func() { close(u.cancelled) })
		}
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

// Requests returns the requests seen so far.
func (u *Upstream) Requests() []Seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Seen(nil), u.reqs...)
}

// Cancelled is closed once a stalled request's context was cancelled: the
// proof that the gateway cancelled the upstream request.
func (u *Upstream) Cancelled() <-chan struct{} { return u.cancelled }

// Collect runs req through a and provider.Normalize, checks the strict
// stream grammar, and returns the chunks.
func Collect(t testing.TB, ctx context.Context, a provider.Adapter, req *llmv1.GenerateRequest) []*llmv1.StreamChunk {
	t.Helper()
	var out []*llmv1.StreamChunk
	for c := range provider.Normalize(ctx, slog.New(slog.DiscardHandler), "test", a.Stream(ctx, req)) {
		out = append(out, c)
	}
	if err := llmstream.CheckStream(out); err != nil {
		t.Errorf("stream grammar: %v\nchunks:\n%s", err, Format(out))
	}
	return out
}

// Finish returns the stream's finish chunk (the last chunk).
func Finish(chunks []*llmv1.StreamChunk) *llmv1.FinishChunk {
	if len(chunks) == 0 {
		return nil
	}
	return chunks[len(chunks)-1].GetFinish()
}

// FailureCode is the code of a failed finish, "" for a successful one.
func FailureCode(chunks []*llmv1.StreamChunk) string {
	f := Finish(chunks)
	if e := f.GetReason().GetError(); e != nil {
		return e.GetFailure().GetCode()
	}
	if a := f.GetReason().GetAborted(); a != nil {
		return a.GetFailure().GetCode()
	}
	return ""
}

// Format renders chunks as one protojson line each (the golden format).
func Format(chunks []*llmv1.StreamChunk) string {
	var b strings.Builder
	for _, c := range chunks {
		j, err := protojson.MarshalOptions{}.Marshal(c)
		if err != nil {
			b.WriteString("!" + err.Error())
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, j); err != nil {
			compact.Write(j)
		}
		b.Write(compact.Bytes())
		b.WriteByte('\n')
	}
	return b.String()
}

// Golden compares chunks with testdata file path (one protojson chunk per
// line), rewriting it when DSH_UPDATE_GOLDEN=1. Both sides are compared in
// Canonical form: how the gateway cut the deltas depends on how the bytes
// arrived (it merges deltas already waiting), what they assemble to does not.
func Golden(t testing.TB, path string, chunks []*llmv1.StreamChunk) {
	t.Helper()
	chunks = Canonical(chunks)
	got := Format(chunks)
	if os.Getenv("DSH_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run with DSH_UPDATE_GOLDEN=1 to create it)", path, err)
	}
	wantChunks, err := Parse(want)
	if err != nil {
		t.Fatalf("golden %s: %v", path, err)
	}
	wantChunks = Canonical(wantChunks)
	if diff := cmp.Diff(wantChunks, chunks, protocmp.Transform()); diff != "" {
		t.Errorf("chunks differ from %s (-want +got):\n%s\ngot:\n%s", path, diff, got)
	}
}

// Canonical merges consecutive deltas of one block into one (a tool call's
// name kept), the form of a stream whose deltas all arrived at once. Two
// streams that assemble to the same message have the same canonical form.
func Canonical(chunks []*llmv1.StreamChunk) []*llmv1.StreamChunk {
	var out []*llmv1.StreamChunk
	for _, c := range chunks {
		if n := len(out); n > 0 && mergeDelta(out[n-1], c) {
			continue
		}
		out = append(out, proto.CloneOf(c))
	}
	return out
}

// mergeDelta appends delta c to delta dst when both are of one block.
func mergeDelta(dst, c *llmv1.StreamChunk) bool {
	switch d := dst.GetChunk().(type) {
	case *llmv1.StreamChunk_TextDelta:
		if x := c.GetTextDelta(); x != nil && x.GetIndex() == d.TextDelta.GetIndex() {
			d.TextDelta.Text += x.GetText()
			return true
		}
	case *llmv1.StreamChunk_ReasoningDelta:
		if x := c.GetReasoningDelta(); x != nil && x.GetIndex() == d.ReasoningDelta.GetIndex() {
			d.ReasoningDelta.Text += x.GetText()
			return true
		}
	case *llmv1.StreamChunk_ToolCallDelta:
		x := c.GetToolCallDelta()
		if x == nil || x.GetIndex() != d.ToolCallDelta.GetIndex() || x.GetId() != d.ToolCallDelta.GetId() ||
			(x.Name != nil && d.ToolCallDelta.Name != nil && x.GetName() != d.ToolCallDelta.GetName()) {
			return false
		}
		d.ToolCallDelta.ArgumentsDelta += x.GetArgumentsDelta()
		if x.Name != nil {
			d.ToolCallDelta.Name = x.Name
		}
		return true
	}
	return false
}

// Parse reads the golden format.
func Parse(b []byte) ([]*llmv1.StreamChunk, error) {
	var out []*llmv1.StreamChunk
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		c := &llmv1.StreamChunk{}
		if err := protojson.Unmarshal([]byte(line), c); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Subject is an adapter under conformance test with a request it can
// answer.
type Subject struct {
	Adapter provider.Adapter
	Request *llmv1.GenerateRequest
	// Upstream is the fake provider, nil for adapters with none.
	Upstream *Upstream
}

// Mode selects the behaviour a Factory's subject must show.
type Mode int

const (
	// Normal answers the request successfully with text.
	Normal Mode = iota
	// Stall emits at least one chunk and then waits until cancelled.
	Stall
)

// Factory builds a fresh subject for a mode.
type Factory func(t *testing.T, m Mode) Subject

// Run is the conformance suite. Every adapter runs it.
func Run(t *testing.T, newSubject Factory) {
	t.Run("Grammar", func(t *testing.T) {
		t.Parallel()
		s := newSubject(t, Normal)
		chunks := Collect(t, t.Context(), s.Adapter, s.Request)
		if code := FailureCode(chunks); code != "" {
			t.Fatalf("normal stream failed with %s:\n%s", code, Format(chunks))
		}
		var a llmstream.Assembler
		for _, c := range chunks {
			a.Push(c)
		}
		if _, err := a.Message(); err != nil {
			t.Errorf("assembling the stream: %v", err)
		}
	})
	t.Run("RequestNotMutated", func(t *testing.T) {
		t.Parallel()
		s := newSubject(t, Normal)
		before := cloneReq(s.Request)
		_ = s.Adapter.Validate(s.Request)
		Collect(t, t.Context(), s.Adapter, s.Request)
		if diff := cmp.Diff(before, s.Request, protocmp.Transform()); diff != "" {
			t.Errorf("adapter mutated the request (-before +after):\n%s", diff)
		}
	})
	t.Run("CancelMidStream", func(t *testing.T) {
		t.Parallel()
		s := newSubject(t, Stall)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var out []*llmv1.StreamChunk
		done := make(chan struct{})
		go func() {
			defer close(done)
			for c := range provider.Normalize(ctx, slog.New(slog.DiscardHandler), "test", s.Adapter.Stream(ctx, s.Request)) {
				if len(out) == 0 {
					cancel()
				}
				out = append(out, c)
			}
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("stream did not end after cancel")
		}
		if err := llmstream.CheckStream(out); err != nil {
			t.Errorf("grammar after cancel: %v\n%s", err, Format(out))
		}
		if code := FailureCode(out); code != provider.CodeAborted {
			t.Errorf("finish code = %q, want ABORTED\n%s", code, Format(out))
		}
		if Finish(out).GetReason().GetAborted() == nil {
			t.Errorf("finish is not aborted: %v", Finish(out))
		}
		if s.Upstream != nil {
			select {
			case <-s.Upstream.Cancelled():
			case <-time.After(5 * time.Second):
				t.Error("the upstream request was not cancelled")
			}
		}
	})
	t.Run("ConsumerStopsEarly", func(t *testing.T) {
		t.Parallel()
		s := newSubject(t, Stall)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range s.Adapter.Stream(t.Context(), s.Request) {
				break
			}
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("adapter did not return after the consumer stopped")
		}
		if s.Upstream != nil {
			select {
			case <-s.Upstream.Cancelled():
			case <-time.After(5 * time.Second):
				t.Error("the upstream request was not cancelled after the consumer stopped")
			}
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		s := newSubject(t, Normal)
		var wg sync.WaitGroup
		results := make([]string, 4)
		for i := range results {
			wg.Go(func() {
				results[i] = Format(Collect(t, t.Context(), s.Adapter, s.Request))
			})
		}
		wg.Wait()
		for i := 1; i < len(results); i++ {
			if results[i] != results[0] {
				t.Errorf("concurrent stream %d differs:\n%s\nvs\n%s", i, results[i], results[0])
			}
		}
	})
	t.Run("Catalogue", func(t *testing.T) {
		t.Parallel()
		s := newSubject(t, Normal)
		seen := map[string]bool{}
		for _, m := range s.Adapter.Models() {
			if m.ID == "" || seen[m.ID] || m.ContextWindow < 0 {
				t.Errorf("bad catalogue entry %+v", m)
			}
			seen[m.ID] = true
		}
		if s.Adapter.Kind() == "" {
			t.Error("empty Kind")
		}
	})
}

func cloneReq(r *llmv1.GenerateRequest) *llmv1.GenerateRequest {
	b, err := protojson.Marshal(r)
	if err != nil {
		panic(err)
	}
	out := &llmv1.GenerateRequest{}
	if err := protojson.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

// Case is one replayed upstream scenario for an adapter.
type Case struct {
	Name  string
	Reply Reply
	// Idle is the adapter's idle bound; the default when zero.
	Idle time.Duration
	// Code is the expected failure code; "" expects success.
	Code string
	// Status, RetryAfterMS and RequestID, when set, are expected on the
	// failure.
	Status       int32
	RetryAfterMS int64
	RequestID    string
	// Golden names testdata/golden/<Golden>.chunks; empty skips the exact
	// sequence check (for failures whose message holds a random port).
	Golden string
}

// NewAdapter builds the adapter under test against an upstream URL.
type NewAdapter func(t *testing.T, baseURL string, idle time.Duration) provider.Adapter

// RunCases replays each case against a fresh upstream and checks the
// grammar, the failure facts, and the golden chunk sequence.
func RunCases(t *testing.T, cases []Case, newAdapter NewAdapter, req *llmv1.GenerateRequest) {
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			up := Serve(t, tc.Reply)
			a := newAdapter(t, up.URL, tc.Idle)
			chunks := Collect(t, t.Context(), a, req)
			if got := FailureCode(chunks); got != tc.Code {
				t.Fatalf("failure code = %q, want %q\n%s", got, tc.Code, Format(chunks))
			}
			if tc.Code != "" {
				f := Finish(chunks).GetReason().GetError().GetFailure()
				if f == nil {
					f = Finish(chunks).GetReason().GetAborted().GetFailure()
				}
				if tc.Status != 0 && f.GetStatus() != tc.Status {
					t.Errorf("status = %d, want %d", f.GetStatus(), tc.Status)
				}
				if tc.RetryAfterMS != 0 && f.GetProviderRetryAfterMs() != tc.RetryAfterMS {
					t.Errorf("retry after = %d ms, want %d", f.GetProviderRetryAfterMs(), tc.RetryAfterMS)
				}
				if tc.RequestID != "" && f.GetRequestId() != tc.RequestID {
					t.Errorf("request id = %q, want %q", f.GetRequestId(), tc.RequestID)
				}
				if Finish(chunks).ReplayState != nil {
					t.Error("replay state on a failed finish")
				}
			}
			if tc.Golden != "" {
				Golden(t, filepath.Join("testdata", "golden", tc.Golden+".chunks"), chunks)
			}
		})
	}
}

// ReadFile reads a testdata file or fails the test.
func ReadFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// After returns the offset just past the event (ending in a blank line)
// that contains marker, for StallAfter / ResetAfter.
func After(t testing.TB, body []byte, marker string) int {
	t.Helper()
	i := bytes.Index(body, []byte(marker))
	if i < 0 {
		t.Fatalf("marker %q not in body", marker)
	}
	j := bytes.Index(body[i:], []byte("\n\n"))
	if j < 0 {
		t.Fatalf("no event end after marker %q", marker)
	}
	return i + j + 2
}

// StaticTransport answers every request with status 200 and body, without
// a network: for fuzzing adapters with arbitrary provider bytes.
type StaticTransport []byte

// RoundTrip implements http.RoundTripper.
func (b StaticTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"text/event-stream"}},
		Body:       io.NopCloser(bytes.NewReader(b)),
		Request:    r,
	}, nil
}

// FuzzGrammar feeds body to a fresh adapter and fails unless the
// normalised stream is grammatical and ends with exactly one finish.
func FuzzGrammar(t *testing.T, a provider.Adapter, req *llmv1.GenerateRequest) {
	t.Helper()
	var out []*llmv1.StreamChunk
	for c := range provider.Normalize(t.Context(), slog.New(slog.DiscardHandler), "fuzz", a.Stream(t.Context(), req)) {
		out = append(out, c)
	}
	if err := llmstream.CheckStream(out); err != nil {
		t.Fatalf("stream grammar: %v\n%s", err, Format(out))
	}
	for _, c := range out {
		if _, err := proto.Marshal(c); err != nil {
			t.Fatalf("chunk cannot be sent: %v: %v", err, c)
		}
	}
}

// RichContentRequest is a conversation whose user turns and tool results
// hold what not every route can carry: images (inline PNG, a URL, an SVG, one
// without a MIME type), audio, a text and a binary document, a PDF, a
// resource link, and blocks annotated for the user only. Every adapter must
// build a request from it (degrading what it cannot send), never reject it.
func RichContentRequest(provider, model string) *llmv1.GenerateRequest {
	text := func(s string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
	}
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	img := func(src *llmv1.ImageBlock) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: src}}
	}
	userOnly := &llmv1.ContentAnnotations{Audience: []string{"user"}}
	result := func(id string, blocks ...*llmv1.ContentBlock) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: blocks}}}
	}
	call := func(id, name string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: name, Arguments: `{}`}}}
	}
	return &llmv1.GenerateRequest{Provider: provider, Model: model, Messages: []*llmv1.Message{
		{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("show me the files")}},
		{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{call("c1", "read_media_file"), call("c2", "read_resource"), call("c3", "annotated"), call("c4", "empty")}},
		{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
			result("c1",
				text("two images:"),
				img(&llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: png}, MimeType: "image/png"}),
				img(&llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://example.com/cat.jpg"}}),
				img(&llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: png}}),
				img(&llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte("<svg/>")}, MimeType: "image/svg+xml"}),
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: []byte("RIFF0000WAVE"), MimeType: "audio/wav"}}}),
			result("c2",
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///notes.md", MimeType: "text/markdown", Name: "notes.md", Content: &llmv1.DocumentBlock_Text{Text: "# Notes\nbuy milk"}}}},
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a.pdf", MimeType: "application/pdf", Content: &llmv1.DocumentBlock_Data{Data: []byte("%PDF-1.7")}}}},
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a.bin", MimeType: "application/octet-stream", Content: &llmv1.DocumentBlock_Data{Data: []byte{0, 1, 2}}}}},
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Uri: "memory://graph", Name: "graph", Description: "the knowledge graph", MimeType: "application/json", Size: proto.Int64(2048)}}}),
			result("c3",
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "for your eyes only"}}, Annotations: userOnly},
				&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "for the model"}}, Annotations: &llmv1.ContentAnnotations{Audience: []string{"assistant"}, Priority: proto.Float64(0.9)}}),
			result("c4", &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "progress bar"}}, Annotations: userOnly}),
			text("what do you see?"),
			img(&llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "data:image/jpeg;base64,/9j/4AAQ"}}),
			&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "(user-only note)"}}, Annotations: userOnly},
		}},
	}}
}

// GoldenJSON compares a JSON body, indented, with testdata file path,
// rewriting it when DSH_UPDATE_GOLDEN=1.
func GoldenJSON(t testing.TB, path string, body []byte) {
	t.Helper()
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, body, "", "  "); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, body)
	}
	if os.Getenv("DSH_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run with DSH_UPDATE_GOLDEN=1 to create it)", path, err)
	}
	if diff := cmp.Diff(string(bytes.TrimSpace(want)), string(bytes.TrimSpace(pretty.Bytes()))); diff != "" {
		t.Errorf("body differs from %s (-want +got):\n%s", path, diff)
	}
}

// BodyBuilder is an adapter that exposes the request body it would send.
type BodyBuilder interface {
	provider.Adapter
	Body(req *llmv1.GenerateRequest) ([]byte, int, error)
}

// RichContentBody validates and builds RichContentRequest with a, compares
// the body with the golden file testdata/golden/request_rich.json, checks
// that no block meant for the user only reached it, and returns it.
func RichContentBody(t testing.TB, a BodyBuilder, route, model string) []byte {
	t.Helper()
	req := RichContentRequest(route, model)
	if err := a.Validate(req); err != nil {
		t.Fatalf("Validate = %v (content a route cannot carry must be degraded, not refused)", err)
	}
	body, _, err := a.Body(req)
	if err != nil {
		t.Fatal(err)
	}
	GoldenJSON(t, filepath.Join("testdata", "golden", "request_rich.json"), body)
	for _, leak := range []string{"for your eyes only", "progress bar", "user-only note"} {
		if bytes.Contains(body, []byte(leak)) {
			t.Errorf("the body carries the user-only text %q", leak)
		}
	}
	return body
}

// LoadRequest is the last model request of a 5-step `read` turn of the load
// benchmark (tests/load), as the gateway sent it upstream (the file at
// path, services/llmgateway/testdata/load_request.json: system prompt, 17
// built-in tool schemas, 5 tool calls with their results), turned back into
// the GenerateRequest the agent sent for it.
func LoadRequest(tb testing.TB, path string) *llmv1.GenerateRequest {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var body struct {
		Messages []struct {
			Role       string `json:"role"`
			Content    string `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		tb.Fatal(err)
	}
	text := func(s string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
	}
	req := &llmv1.GenerateRequest{Provider: "local", Model: "m"}
	for _, m := range body.Messages {
		switch m.Role {
		case "system":
			req.System = &m.Content
		case "user":
			req.Messages = append(req.Messages, &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text(m.Content)}})
		case "assistant":
			msg := &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT}
			if m.Content != "" {
				msg.Content = append(msg.Content, text(m.Content))
			}
			for _, c := range m.ToolCalls {
				msg.Content = append(msg.Content, &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments}}})
			}
			req.Messages = append(req.Messages, msg)
		case "tool":
			req.Messages = append(req.Messages, &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: m.ToolCallID, Content: []*llmv1.ContentBlock{text(m.Content)}}}}}})
		}
	}
	for _, t := range body.Tools {
		req.Tools = append(req.Tools, &llmv1.ToolSchema{Name: t.Function.Name, Description: t.Function.Description, Parameters: string(t.Function.Parameters)})
	}
	return req
}
