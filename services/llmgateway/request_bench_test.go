package llmgateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

// loadRequest is the load benchmark's last model request of a turn
// (providertest.LoadRequest).
func loadRequest(tb testing.TB) *llmv1.GenerateRequest {
	return providertest.LoadRequest(tb, "testdata/load_request.json")
}

// toolCallUpstream answers every request as the load benchmark's upstream
// does for a tool step: a text delta, one tool call whose arguments arrive
// in 12-byte deltas, the finish and usage events, [DONE].
func toolCallUpstream(b *testing.B) string { return slowToolCallUpstream(b, 0) }

// slowToolCallUpstream is toolCallUpstream answering after latency (the
// model's time to its first token, which keeps that many more streams in
// flight at once).
func slowToolCallUpstream(b *testing.B, latency time.Duration) string {
	head := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"load","choices":[`
	events := []string{
		`{"index":0,"delta":{"role":"assistant","content":"Step."},"finish_reason":null}]}`,
		`{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_6","type":"function","function":{"name":"read","arguments":"{\"file_path\""}}]},"finish_reason":null}]}`,
		`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":\"notes.txt\""}}]},"finish_reason":null}]}`,
		`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]},"finish_reason":null}]}`,
		`{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`,
	}
	var payload string
	for _, e := range events {
		payload += head + e + "\n\n"
	}
	payload += "data: [DONE]\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if latency > 0 {
			time.Sleep(latency) // the model's latency, not a synchronisation
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, payload)
		w.(http.Flusher).Flush()
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// BenchmarkProcessRequestCPU measures the gateway process's CPU per model
// request, out of process, for the load benchmark's request (a 22 KB
// conversation with 17 tool schemas) answered by a tool-call stream, with
// width requests in flight at once (each iteration is one such batch):
// the figure the load ladder reports as the gateway's CPU per step
// (1.01 ms at 1,000 `read` sessions before issue 19's gateway work).
// width=512 answers after 50 ms, so that all 512 streams are in flight at
// once, more than the gateway's 256 stream workers: the load ladder's case,
// where streams past the pool start on new goroutines.
func BenchmarkProcessRequestCPU(b *testing.B) {
	req := loadRequest(b)
	for _, width := range []int{1, 64, 512} {
		b.Run(fmt.Sprintf("width=%d", width), func(b *testing.B) {
			var latency time.Duration
			if width > streamWorkers {
				latency = 50 * time.Millisecond
			}
			g := startProcess(b, slowToolCallUpstream(b, latency))
			ctx := context.Background()
			one := func() error {
				s, err := g.client.Generate(ctx, req)
				if err != nil {
					return err
				}
				calls := 0
				for {
					r, err := s.Recv()
					if err == io.EOF {
						break
					}
					if err != nil {
						return err
					}
					if r.GetChunk().GetBlockStart().GetBlockType() == llmv1.BlockType_BLOCK_TYPE_TOOL_CALL {
						calls++
					}
					if f := r.GetChunk().GetFinish(); f != nil && f.GetReason().GetToolCalls() == nil {
						return fmt.Errorf("finish %v", f)
					}
				}
				if calls != 1 {
					return fmt.Errorf("%d tool calls, want 1", calls)
				}
				return nil
			}
			batch := func() {
				var wg sync.WaitGroup
				errs := make(chan error, width)
				for range width {
					wg.Go(func() {
						if err := one(); err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
			for range 3 {
				batch() // warm: connections, pools, caches
			}
			var per []time.Duration
			f0 := g.faults(b)
			for b.Loop() {
				c0 := g.cpu(b)
				batch()
				per = append(per, (g.cpu(b)-c0)/time.Duration(width))
			}
			b.ReportMetric(median(per)/1e3, "gateway-cpu-µs/request")
			b.ReportMetric(float64(g.faults(b)-f0)/float64(b.N*width), "gateway-faults/request")
		})
	}
}

// BenchmarkProcessBatchCPU measures what batched responses
// (GenerateRequest.batch_chunks) save the gateway process per model
// request: the load benchmark's request answered by the tool-call stream,
// 64 requests in flight at once, one process, each iteration one round of
// 64 single-chunk requests and one of 64 batched ones (alternating which
// goes first, so the machine's load hits both alike). It reports the
// median CPU per request of each, their per-round ratio, and the messages
// per request.
func BenchmarkProcessBatchCPU(b *testing.B) {
	const width = 64
	req := loadRequest(b)
	g := startProcess(b, toolCallUpstream(b))
	ctx := context.Background()
	one := func(batch bool) (int, error) {
		r := proto.CloneOf(req)
		r.BatchChunks = batch
		s, err := g.client.Generate(ctx, r)
		if err != nil {
			return 0, err
		}
		msgs, chunks, calls := 0, 0, 0
		for {
			m, err := s.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return 0, err
			}
			msgs++
			for _, c := range appendChunks(nil, m) {
				chunks++
				if c.GetBlockStart().GetBlockType() == llmv1.BlockType_BLOCK_TYPE_TOOL_CALL {
					calls++
				}
				if f := c.GetFinish(); f != nil && f.GetReason().GetToolCalls() == nil {
					return 0, fmt.Errorf("finish %v", f)
				}
			}
		}
		if calls != 1 || chunks < 6 {
			return 0, fmt.Errorf("%d tool calls in %d chunks, want 1", calls, chunks)
		}
		return msgs, nil
	}
	round := func(batch bool) (time.Duration, int) {
		var wg sync.WaitGroup
		var msgs atomic.Int64
		errs := make(chan error, width)
		c0 := g.cpu(b)
		for range width {
			wg.Go(func() {
				n, err := one(batch)
				if err != nil {
					errs <- err
				}
				msgs.Add(int64(n))
			})
		}
		wg.Wait()
		cpu := (g.cpu(b) - c0) / width
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return cpu, int(msgs.Load()) / width
	}
	for range 3 {
		round(false) // warm: connections, pools, caches
		round(true)
	}
	var single, batched, ratio []time.Duration
	var msgsSingle, msgsBatched int
	i := 0
	for b.Loop() {
		var s, bt time.Duration
		if i%2 == 0 {
			s, msgsSingle = round(false)
			bt, msgsBatched = round(true)
		} else {
			bt, msgsBatched = round(true)
			s, msgsSingle = round(false)
		}
		i++
		single, batched, ratio = append(single, s), append(batched, bt), append(ratio, time.Duration(1000*float64(bt)/float64(s)))
	}
	b.ReportMetric(median(single)/1e3, "single-cpu-µs/request")
	b.ReportMetric(median(batched)/1e3, "batched-cpu-µs/request")
	b.ReportMetric(median(ratio)/1e3, "batched/single")
	b.ReportMetric(float64(msgsSingle), "single-msgs/request")
	b.ReportMetric(float64(msgsBatched), "batched-msgs/request")
}

// BenchmarkPrepareBody measures what the gateway does to the load
// benchmark's request before sending it: validation (prepare) and the
// chat-completions body, in process (-benchmem counts its allocations).
func BenchmarkPrepareBody(b *testing.B) {
	svc, err := New(Config{Routes: []RouteConfig{{Name: "local", Kind: KindOpenAI, BaseURL: "http://127.0.0.1:1"}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	req := loadRequest(b)
	a := svc.byName["local"].adapter.(interface {
		Body(*llmv1.GenerateRequest) ([]byte, int, error)
	})
	b.ReportAllocs()
	size := 0
	for b.Loop() {
		_, preq, err := svc.prepare(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _, err := a.Body(preq)
		if err != nil {
			b.Fatal(err)
		}
		size = len(body)
	}
	b.SetBytes(int64(size))
}

// conversationAt is the load benchmark's conversation at a step: the
// user's prompt and the first step-1 tool calls with their results, the
// load request's five repeated (with fresh call ids) for steps past six.
func conversationAt(tb testing.TB, step int) *llmv1.GenerateRequest {
	req := loadRequest(tb)
	base := req.Messages
	msgs := []*llmv1.Message{base[0]}
	for i := 0; len(msgs) < 1+2*(step-1); i++ {
		call, result := base[1+2*(i%5)], base[2+2*(i%5)]
		if i >= 5 {
			id := fmt.Sprintf("call_r%d", i)
			call, result = proto.CloneOf(call), proto.CloneOf(result)
			call.Content[len(call.Content)-1].GetToolCall().Id = id
			result.Content[0].GetToolResult().ToolCallId = id
		}
		msgs = append(msgs, call, result)
	}
	req.Messages = msgs
	return req
}

// BenchmarkConversationCPU measures the gateway process's CPU per model
// request at a step of a conversation (1, 5, and a long one of 50 steps),
// out of process, 64 conversations at once, answered by a tool-call
// stream: mode=whole sends the whole conversation every step (the agent
// before remembered conversations), mode=prefix names the conversation the
// gateway remembered at the previous step and sends the two new messages
// only (the same system prompt and tools: not sent either), as the agent
// does; at step 1 there is none: the whole request, remembered. The 64
// conversations are the same 64 in every iteration (each replaces its
// entry), so the gateway holds what it would for 64 live sessions. The previous
// steps are sent outside the measured window.
func BenchmarkConversationCPU(b *testing.B) {
	const width = 64
	for _, step := range []int{1, 5, 50} {
		for _, mode := range []string{"whole", "prefix"} {
			b.Run(fmt.Sprintf("step=%d/mode=%s", step, mode), func(b *testing.B) {
				g := startProcess(b, toolCallUpstream(b))
				ctx := context.Background()
				conv := conversationAt(b, step)
				prevN := max(0, len(conv.Messages)-2)
				send := func(req *llmv1.GenerateRequest) (string, error) {
					var hdr metadata.MD
					s, err := g.client.Generate(ctx, req, grpc.Header(&hdr))
					if err != nil {
						return "", err
					}
					for {
						_, err := s.Recv()
						if err == io.EOF {
							break
						}
						if err != nil {
							return "", err
						}
					}
					if v := hdr.Get(PrefixHeader); len(v) == 1 {
						return v[0], nil
					}
					return "", nil
				}
				// one conversation: the previous step (unmeasured) then the
				// measured one, split by the barrier.
				run := func(measure func()) {
					ids := make([]string, width)
					tenants := make([]string, width)
					var wg sync.WaitGroup
					errs := make(chan error, 2*width)
					for i := range width {
						tenants[i] = fmt.Sprint("bench-", i)
						if mode != "prefix" || prevN == 0 {
							continue
						}
						wg.Go(func() {
							r := proto.CloneOf(conv)
							r.Messages, r.Tenant, r.RememberPrefix = conv.Messages[:prevN], tenants[i], true
							id, err := send(r)
							if err == nil && id == "" {
								err = fmt.Errorf("not remembered")
							}
							ids[i] = id
							errs <- err
						})
					}
					wg.Wait()
					measure()
					for i := range width {
						wg.Go(func() {
							r := &llmv1.GenerateRequest{Provider: conv.Provider, Model: conv.Model, System: conv.System, Tools: conv.Tools, Messages: conv.Messages}
							if mode == "prefix" {
								r.Tenant, r.RememberPrefix = tenants[i], true
								if ids[i] != "" {
									r.Prefix, r.Messages, r.Continued = &llmv1.PrefixRef{Id: ids[i], Count: uint32(prevN), SameSystem: true, SameTools: true}, nil, conv.Messages[prevN:]
									r.System, r.Tools = nil, nil
								}
							}
							_, err := send(r)
							errs <- err
						})
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
				}
				for range 3 {
					run(func() {}) // warm: connections, pools, caches
				}
				var per []time.Duration
				for b.Loop() {
					var c0 time.Duration
					run(func() { c0 = g.cpu(b) })
					per = append(per, (g.cpu(b)-c0)/width)
				}
				b.ReportMetric(median(per)/1e3, "gateway-cpu-µs/request")
				b.ReportMetric(float64(proto.Size(conv)), "request-bytes")
			})
		}
	}
}
