package llmgateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/dsh-dev/dsh/internal/cputime"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/sse"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
	json "github.com/segmentio/encoding/json"
)

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
// (as any client that wants the text must): the baseline. onChunk is called
// at every content event.
func direct(ctx context.Context, hc *http.Client, url string, onChunk func()) (int, error) {
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
			onChunk()
			n++
		}
	}
}

// viaGateway streams the same upstream through the gateway over loopback
// gRPC; onChunk is called for every provider chunk a delta carries.
func viaGateway(ctx context.Context, c llmv1.LlmGatewayClient, onChunk func()) (int, error) {
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
		// The gateway merges deltas that arrive together: count the
		// provider's chunks (one "tok" each) a delta carries.
		if d := r.GetChunk().GetTextDelta(); d != nil {
			for range strings.Count(d.GetText(), "tok") {
				onChunk()
				n++
			}
		}
	}
}

// runner streams once; onChunk is called at the arrival of every content
// chunk.
type runner func(ctx context.Context, onChunk func()) (int, error)

// runChunks runs and records the arrival time of every content chunk.
func runChunks(ctx context.Context, run runner, arrived *[]time.Time) (int, error) {
	return run(ctx, func() { *arrived = append(*arrived, time.Now()) })
}

// first adapts a callback to fire only at the first chunk.
func first(f func()) func() {
	done := false
	return func() {
		if !done {
			done = true
			f()
		}
	}
}

func benchRunners(b *testing.B, url string) map[string]runner {
	hc := &http.Client{Transport: upstream.NewTransport()}
	c := startGateway(b, Config{Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: url}}})
	return map[string]runner{
		"direct":  func(ctx context.Context, f func()) (int, error) { return direct(ctx, hc, url, f) },
		"gateway": func(ctx context.Context, f func()) (int, error) { return viaGateway(ctx, c, f) },
	}
}

func median(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2].Nanoseconds())
}

// BenchmarkFirstChunk measures time to the first content chunk of a short
// stream, directly and through the gateway, in pairs (alternating which
// goes first) so that the machine's changing load hits both sides alike.
// added-ttfc-µs is the median of the per-pair differences.
func BenchmarkFirstChunk(b *testing.B) {
	url := benchUpstream(b, 3)
	runners := benchRunners(b, url)
	ctx := context.Background()
	one := func(run runner) time.Duration {
		var ttfc time.Duration
		start := time.Now()
		if _, err := run(ctx, first(func() { ttfc = time.Since(start) })); err != nil {
			b.Fatal(err)
		}
		return ttfc
	}
	one(runners["direct"])
	one(runners["gateway"])
	var direct, gateway, added []time.Duration
	i := 0
	for b.Loop() {
		var d, g time.Duration
		if i%2 == 0 {
			d, g = one(runners["direct"]), one(runners["gateway"])
		} else {
			g, d = one(runners["gateway"]), one(runners["direct"])
		}
		i++
		direct, gateway, added = append(direct, d), append(gateway, g), append(added, g-d)
	}
	b.ReportMetric(median(direct)/1e3, "direct-ttfc-µs")
	b.ReportMetric(median(gateway)/1e3, "gateway-ttfc-µs")
	b.ReportMetric(median(added)/1e3, "added-ttfc-µs")
}

// BenchmarkStreamChunks measures a 1000-chunk stream directly and through
// the gateway, in alternating pairs. added-ns/chunk is the median per-pair
// difference of wall time per chunk, added-cpu-ns/chunk the same for the
// process's CPU time (upstream, gateway and client all run in this
// process), added-allocs/chunk the difference of heap allocations.
func BenchmarkStreamChunks(b *testing.B) {
	const n = 1000
	url := benchUpstream(b, n)
	runners := benchRunners(b, url)
	ctx := context.Background()
	type cost struct {
		wall, cpu time.Duration
		allocs    uint64
	}
	var ms runtime.MemStats
	one := func(run runner) cost {
		runtime.ReadMemStats(&ms)
		a0, c0, t0 := ms.Mallocs, cputime.Process(), time.Now()
		got, err := run(ctx, func() {})
		t1, c1 := time.Now(), cputime.Process()
		runtime.ReadMemStats(&ms)
		if err != nil || got != n {
			b.Fatalf("got %d chunks, err %v", got, err)
		}
		return cost{wall: t1.Sub(t0), cpu: c1 - c0, allocs: ms.Mallocs - a0}
	}
	one(runners["direct"])
	one(runners["gateway"])
	var dWall, gWall, addWall, addCPU []time.Duration
	var dAllocs, gAllocs uint64
	i := 0
	for b.Loop() {
		var d, g cost
		if i%2 == 0 {
			d, g = one(runners["direct"]), one(runners["gateway"])
		} else {
			g, d = one(runners["gateway"]), one(runners["direct"])
		}
		i++
		dWall, gWall = append(dWall, d.wall/n), append(gWall, g.wall/n)
		addWall, addCPU = append(addWall, (g.wall-d.wall)/n), append(addCPU, (g.cpu-d.cpu)/n)
		dAllocs += d.allocs
		gAllocs += g.allocs
	}
	b.ReportMetric(median(dWall), "direct-ns/chunk")
	b.ReportMetric(median(gWall), "gateway-ns/chunk")
	b.ReportMetric(median(addWall), "added-ns/chunk")
	b.ReportMetric(median(addCPU), "added-cpu-ns/chunk")
	b.ReportMetric((float64(gAllocs)-float64(dAllocs))/float64(i*n), "added-allocs/chunk")
}

// BenchmarkAdapterChunks measures the adapter and normalisation alone (no
// gRPC): SSE parse, JSON decode, chunk building, per provider chunk.
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
	start, cpu := time.Now(), cputime.Process()
	chunks := 0
	for b.Loop() {
		for c := range svc.stream(context.Background(), r, req) {
			chunks += strings.Count(c.GetTextDelta().GetText(), "tok")
			if f := c.GetFinish(); f != nil && f.GetReason().GetStop() == nil {
				b.Fatal(provider.AsFailure(errors.New(f.String())))
			}
		}
	}
	elapsed, cpuUsed := time.Since(start), cputime.Process()-cpu
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(chunks), "ns/chunk")
	b.ReportMetric(float64(cpuUsed.Nanoseconds())/float64(chunks), "cpu-ns/chunk")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(chunks), "allocs/chunk")
}

// BenchmarkGRPCFloor streams 1000 chunks from the scripted adapter (no
// network, no JSON) through the gateway over loopback gRPC and in process:
// the difference is the gRPC transport's own cost per message, a floor for
// any gateway built on one message per chunk.
func BenchmarkGRPCFloor(b *testing.B) {
	const n = 1000
	script := `[{"text":"` + strings.Repeat("tok ", n) + `"}]`
	cfg := Config{Routes: []RouteConfig{{Name: "s", Kind: KindScripted, Script: script}}}
	svc, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	c := startGateway(b, cfg)
	req := &llmv1.GenerateRequest{Provider: "s", Model: "m", Messages: []*llmv1.Message{userText("hi")}}
	r, preq, err := svc.prepare(req)
	if err != nil {
		b.Fatal(err)
	}
	inproc := func() int {
		k := 0
		for ch := range svc.stream(context.Background(), r, preq) {
			if ch.GetTextDelta() != nil {
				k++
			}
		}
		return k
	}
	grpcRun := func() int {
		s, err := c.Generate(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		k := 0
		for {
			m, err := s.Recv()
			if err != nil {
				break
			}
			if m.GetChunk().GetTextDelta() != nil {
				k++
			}
		}
		return k
	}
	var added []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if inproc() != n {
			b.Fatal("short in-process stream")
		}
		t1 := time.Now()
		if grpcRun() != n {
			b.Fatal("short gRPC stream")
		}
		added = append(added, (time.Since(t1)-t1.Sub(t0))/n)
	}
	b.ReportMetric(median(added), "grpc-ns/msg")
}

// pacedUpstream sends n chunks spaced by gap (a provider producing tokens)
// and records when it flushed each one.
type pacedUpstream struct {
	url  string
	mu   sync.Mutex
	sent []time.Time
}

func newPacedUpstream(b *testing.B, n int, gap time.Duration) *pacedUpstream {
	p := &pacedUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		p.mu.Lock()
		p.sent = p.sent[:0]
		p.mu.Unlock()
		for i := range n {
			time.Sleep(gap) // the provider's pace, not a wait for an event
			p.mu.Lock()
			p.sent = append(p.sent, time.Now()) // stamped before the write: both paths pay the write alike
			p.mu.Unlock()
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", i)
			fl.Flush()
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		fl.Flush()
	}))
	b.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// BenchmarkChunkLatency measures, for a paced stream (50 chunks, 1 ms
// apart: the realistic case where the gateway is never behind), the delay
// from the upstream's flush of each chunk to its arrival at the client,
// directly and through the gateway, in alternating pairs. added-µs/chunk is
// the median over pairs of the difference of the per-stream median delays.
func BenchmarkChunkLatency(b *testing.B) {
	const n = 50
	p := newPacedUpstream(b, n, time.Millisecond)
	runners := benchRunners(b, p.url)
	ctx := context.Background()
	one := func(run runner) time.Duration {
		var arrived []time.Time
		got, err := runChunks(ctx, run, &arrived)
		if err != nil || got != n {
			b.Fatalf("got %d chunks, err %v", got, err)
		}
		p.mu.Lock()
		sent := slices.Clone(p.sent)
		p.mu.Unlock()
		d := make([]time.Duration, n)
		for i := range n {
			d[i] = arrived[i].Sub(sent[i])
		}
		return time.Duration(median(d))
	}
	one(runners["direct"])
	one(runners["gateway"])
	var direct, gateway, added []time.Duration
	i := 0
	for b.Loop() {
		var d, g time.Duration
		if i%2 == 0 {
			d, g = one(runners["direct"]), one(runners["gateway"])
		} else {
			g, d = one(runners["gateway"]), one(runners["direct"])
		}
		i++
		direct, gateway, added = append(direct, d), append(gateway, g), append(added, g-d)
	}
	b.ReportMetric(median(direct)/1e3, "direct-µs/chunk")
	b.ReportMetric(median(gateway)/1e3, "gateway-µs/chunk")
	b.ReportMetric(median(added)/1e3, "added-µs/chunk")
}
