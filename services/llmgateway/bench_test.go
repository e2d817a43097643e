package llmgateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/sse"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
	json "github.com/segmentio/encoding/json"
)

// cpuTime is the process's user+system CPU time: on a shared machine it
// measures cost where wall time also measures waiting for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchUpstream serves an OpenAI-style stream of n text chunks, flushing
// each one as a provider does.
func benchUpstream(b *testing.B, n int) string {
	b.Helper()
	var body bytes.Buffer
	body.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
	for i := range n {
		fmt.Fprintf(&body, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", i)
	}
	body.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20}}\n\ndata: [DONE]\n\n")
	payload := body.Bytes()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		rest := payload
		for len(rest) > 0 {
			i := bytes.Index(rest, []byte("\n\n")) + 2
			_, _ = w.Write(rest[:i])
			fl.Flush()
			rest = rest[i:]
		}
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

var benchBody = []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)

// directChunk is what a direct client decodes from each event.
type directChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
}

// direct calls the upstream itself, reads its events and decodes each one
// (as any client that wants the text must): the baseline. onFirst is called
// at the first content event.
func direct(ctx context.Context, hc *http.Client, url string, onFirst func()) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/chat/completions", bytes.NewReader(benchBody))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	r := sse.NewReader(resp.Body)
	n := 0
	for {
		ev, err := r.Next()
		if err != nil {
			return n, err
		}
		if string(ev.Data) == "[DONE]" {
			return n, nil
		}
		var c directChunk
		if err := json.Unmarshal(ev.Data, &c); err != nil {
			return n, err
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			if n == 0 {
				onFirst()
			}
			n++
		}
	}
}

// viaGateway streams the same upstream through the gateway over loopback
// gRPC.
func viaGateway(ctx context.Context, c llmv1.LlmGatewayClient, onFirst func()) (int, error) {
	s, err := c.Generate(ctx, &llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("hi")}})
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if r.GetChunk().GetTextDelta() != nil {
			if n == 0 {
				onFirst()
			}
			n++
		}
	}
}

type runner func(ctx context.Context, onFirst func()) (int, error)

func benchRunners(b *testing.B, url string) map[string]runner {
	hc := &http.Client{Transport: upstream.NewTransport()}
	c := startGateway(b, Config{Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: url}}})
	return map[string]runner{
		"direct":  func(ctx context.Context, f func()) (int, error) { return direct(ctx, hc, url, f) },
		"gateway": func(ctx context.Context, f func()) (int, error) { return viaGateway(ctx, c, f) },
	}
}

// BenchmarkFirstChunk measures time to the first content chunk of a short
// stream, directly and through the gateway; compare the ttfc-median-µs
// metrics.
func BenchmarkFirstChunk(b *testing.B) {
	url := benchUpstream(b, 3)
	runners := benchRunners(b, url)
	for _, name := range []string{"direct", "gateway"} {
		run := runners[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			// Warm the connections.
			if _, err := run(ctx, func() {}); err != nil {
				b.Fatal(err)
			}
			ttfc := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				if _, err := run(ctx, func() { ttfc = append(ttfc, time.Since(start)) }); err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(ttfc)
			if len(ttfc) > 0 {
				b.ReportMetric(float64(ttfc[len(ttfc)/2].Nanoseconds())/1e3, "ttfc-median-µs")
			}
		})
	}
}

// BenchmarkStreamChunks measures the cost per streamed chunk of a
// 1000-chunk stream, directly and through the gateway; the difference of
// the ns/chunk and allocs/chunk metrics is what the gateway adds.
func BenchmarkStreamChunks(b *testing.B) {
	const n = 1000
	url := benchUpstream(b, n)
	runners := benchRunners(b, url)
	for _, name := range []string{"direct", "gateway"} {
		run := runners[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			if _, err := run(ctx, func() {}); err != nil {
				b.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start, cpu := time.Now(), cpuTime()
			chunks := 0
			for b.Loop() {
				got, err := run(ctx, func() {})
				if err != nil || got != n {
					b.Fatalf("got %d chunks, err %v", got, err)
				}
				chunks += got
			}
			elapsed, cpuUsed := time.Since(start), cpuTime()-cpu
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(chunks), "ns/chunk")
			b.ReportMetric(float64(cpuUsed.Nanoseconds())/float64(chunks), "cpu-ns/chunk")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(chunks), "allocs/chunk")
		})
	}
}

// BenchmarkAdapterChunks measures the adapter and normalisation alone (no
// gRPC): SSE parse, JSON decode, chunk building.
func BenchmarkAdapterChunks(b *testing.B) {
	const n = 1000
	url := benchUpstream(b, n)
	svc, err := New(Config{Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: url}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	r, req, err := svc.prepare(&llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("hi")}})
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start, cpu := time.Now(), cpuTime()
	chunks := 0
	for b.Loop() {
		for c := range svc.stream(context.Background(), r, req) {
			if c.GetTextDelta() != nil {
				chunks++
			}
			if f := c.GetFinish(); f != nil && f.GetReason().GetStop() == nil {
				b.Fatal(provider.AsFailure(errors.New(f.String())))
			}
		}
	}
	elapsed, cpuUsed := time.Since(start), cpuTime()-cpu
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(chunks), "ns/chunk")
	b.ReportMetric(float64(cpuUsed.Nanoseconds())/float64(chunks), "cpu-ns/chunk")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(chunks), "allocs/chunk")
}
