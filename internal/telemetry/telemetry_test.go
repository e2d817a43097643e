package telemetry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestSetupFromEnvironment(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                   string
		env                    map[string]string
		wantTracing, wantMeter bool
		wantErr                bool
	}{
		{name: "nothing set is no-op", env: nil},
		{name: "endpoint enables both", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, wantTracing: true, wantMeter: true},
		{name: "grpc protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantTracing: true, wantMeter: true},
		{name: "traces only endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, wantTracing: true},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}},
		{name: "traces exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, wantMeter: true},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tel, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "test", Getenv: env(tt.env), NoGlobal: true})
			if (err != nil) != tt.wantErr {
				t.Fatalf("Setup error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if tel.Tracing != tt.wantTracing || tel.Metering != tt.wantMeter {
				t.Errorf("Tracing, Metering = %v, %v; want %v, %v", tel.Tracing, tel.Metering, tt.wantTracing, tt.wantMeter)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_ = tel.Shutdown(ctx) // nothing to flush; the endpoint need not exist
		})
	}
}

func attrMap(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// TestSpanHelpers installs the global provider, so it is not parallel.
func TestSpanHelpers(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "agent", SpanProcessors: []sdktrace.SpanProcessor{rec}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })

	rpcCtx, rpcSpan := tel.TracerProvider.Tracer("rpc").Start(context.Background(), "Send")
	rpcSpan.End()
	ctx, turn := telemetry.StartTurn(context.Background(), "s1", 1, trace.SpanContextFromContext(rpcCtx))
	sctx, step := telemetry.StartStep(ctx, "s1", 1, 1)
	_, call := telemetry.StartModelCall(sctx, "s1", "deepseek", "deepseek-chat")
	telemetry.EndModelCall(call, "deepseek-chat", &llmv1.TokenUsage{InputTokens: 10, OutputTokens: 5, CacheReadTokens: proto.Int64(7)},
		&llmv1.FinishReason{Kind: &llmv1.FinishReason_ToolCalls{ToolCalls: &llmv1.FinishToolCalls{}}})
	_, tool := telemetry.StartToolCall(sctx, "s1", "bash", "call_1", "builtin")
	telemetry.EndToolCall(tool, true, "EXIT_NONZERO")
	step.End()
	telemetry.EndTurn(turn, "completed", "")

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	for _, name := range []string{"dsh.turn", "dsh.step", "chat deepseek-chat", "execute_tool bash"} {
		if spans[name] == nil {
			t.Fatalf("span %q missing; have %v", name, spans)
		}
	}
	tr := spans["dsh.turn"]
	if tr.Parent().IsValid() {
		t.Errorf("turn span has a parent; want a new root")
	}
	if len(tr.Links()) != 1 || tr.Links()[0].SpanContext.SpanID() != rpcSpan.SpanContext().SpanID() {
		t.Errorf("turn links = %v, want the Send span", tr.Links())
	}
	for child, parent := range map[string]string{"dsh.step": "dsh.turn", "chat deepseek-chat": "dsh.step", "execute_tool bash": "dsh.step"} {
		if got, want := spans[child].Parent().SpanID(), spans[parent].SpanContext().SpanID(); got != want {
			t.Errorf("%s parent = %s, want %s", child, got, want)
		}
		if spans[child].SpanContext().TraceID() != tr.SpanContext().TraceID() {
			t.Errorf("%s not in the turn's trace", child)
		}
	}
	model := attrMap(spans["chat deepseek-chat"].Attributes())
	for k, want := range map[string]string{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "deepseek", "gen_ai.system": "deepseek",
		"gen_ai.request.model": "deepseek-chat", "gen_ai.response.model": "deepseek-chat",
	} {
		if got := model[k].AsString(); got != want {
			t.Errorf("model span %s = %q, want %q", k, got, want)
		}
	}
	for k, want := range map[string]int64{"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5, "gen_ai.usage.cache_read.input_tokens": 7} {
		if got := model[k].AsInt64(); got != want {
			t.Errorf("model span %s = %d, want %d", k, got, want)
		}
	}
	if got := model["gen_ai.response.finish_reasons"].AsStringSlice(); len(got) != 1 || got[0] != "tool_calls" {
		t.Errorf("finish reasons = %v", got)
	}
	toolAttrs := attrMap(spans["execute_tool bash"].Attributes())
	if toolAttrs["gen_ai.tool.name"].AsString() != "bash" || toolAttrs["gen_ai.tool.call.id"].AsString() != "call_1" ||
		!toolAttrs["dsh.tool.is_error"].AsBool() || toolAttrs["dsh.tool.host"].AsString() != "builtin" {
		t.Errorf("tool span attributes = %v", toolAttrs)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	ctx := t.Context()
	m.RecordTokens(ctx, "openai", "gpt", &llmv1.TokenUsage{InputTokens: 3, OutputTokens: 4})
	m.RecordStep(ctx, 20*time.Millisecond, "openai", "gpt")
	m.RecordTimeToFirstChunk(ctx, 5*time.Millisecond, "openai", "gpt")
	m.RecordTool(ctx, time.Millisecond, "bash", false)
	m.SessionLoaded(ctx, 1)
	m.RecordPublishLag(ctx, time.Millisecond)
	m.RecordDenial(ctx, "/dsh.agent.v1.AgentService/Send", "PermissionDenied")
	var nilMetrics *telemetry.Metrics
	nilMetrics.RecordTool(ctx, time.Second, "x", true) // must not panic

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			got[md.Name] = true
		}
	}
	for _, name := range []string{telemetry.MetricTokenUsage, telemetry.MetricStepDuration, telemetry.MetricTimeToFirstChunk,
		telemetry.MetricToolDuration, telemetry.MetricActiveSessions, telemetry.MetricPublishLag, telemetry.MetricAuthDenials} {
		if !got[name] {
			t.Errorf("metric %s not collected; got %v", name, got)
		}
	}
}

// TestStepOptionsFollowTheModel records steps while the provider and model
// change, past the number of kept attribute options, and requires each step
// under the attributes it was recorded with (a kept option that did not
// follow would put the later steps under the first model).
func TestStepOptionsFollowTheModel(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	want := map[[2]string]uint64{}
	record := func(provider, model string) {
		m.RecordStep(t.Context(), time.Millisecond, provider, model)
		want[[2]string{provider, model}]++
	}
	for _, pm := range [][2]string{{"openai", "gpt"}, {"openai", "gpt"}, {"anthropic", "gpt"}, {"anthropic", "claude"}, {"openai", "gpt"}} {
		record(pm[0], pm[1])
	}
	for i := range 100 { // past the options kept, then a kept one again
		record("p", fmt.Sprint("m", i%80))
	}
	record("anthropic", "claude")
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[[2]string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name != telemetry.MetricStepDuration {
				continue
			}
			for _, dp := range md.Data.(metricdata.Histogram[float64]).DataPoints {
				p, _ := dp.Attributes.Value("gen_ai.provider.name")
				mo, _ := dp.Attributes.Value("gen_ai.request.model")
				got[[2]string{p.AsString(), mo.AsString()}] += dp.Count
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d provider/model pairs recorded, want %d: %v", len(got), len(want), got)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("steps under %v = %d, want %d", k, got[k], n)
		}
	}
}

// newMetrics is the metrics over a manual reader, nothing global set.
func newMetrics(t *testing.T) (*telemetry.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{MetricReaders: []sdkmetric.Reader{reader}, NoGlobal: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := telemetry.NewMetrics(tel.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	return m, reader
}
