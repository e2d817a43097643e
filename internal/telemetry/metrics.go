package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Metric names.
const (
	MetricTokenUsage       = "gen_ai.client.token.usage"
	MetricStepDuration     = "dsh.step.duration"
	MetricTimeToFirstChunk = "dsh.model.time_to_first_chunk"
	MetricToolDuration     = "dsh.tool.duration"
	MetricActiveSessions   = "dsh.sessions.active"
	MetricPublishLag       = "dsh.nats.publish.lag"
	MetricOversizeEvents   = "dsh.nats.oversize_events"
	MetricAuthDenials      = "dsh.auth.denials"
)

// latencyBuckets suit latencies from a millisecond to a few minutes, in seconds.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Metrics are the dsh metric instruments. The zero value is not usable; a
// nil *Metrics records nothing, so callers need no nil checks.
type Metrics struct {
	tokens     metric.Int64Histogram
	step       metric.Float64Histogram
	firstChunk metric.Float64Histogram
	tool       metric.Float64Histogram
	active     metric.Int64UpDownCounter
	publishLag metric.Float64Histogram
	oversize   metric.Int64Counter
	denials    metric.Int64Counter

	stepOpts  sync.Map // [2]string{provider, model} → metric.MeasurementOption (stepOption)
	stepOptsN atomic.Int32
}

// NewMetrics creates the instruments on mp; nil means the global provider.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	var errs [8]error
	out := &Metrics{}
	out.tokens, errs[0] = m.Int64Histogram(MetricTokenUsage, metric.WithUnit("{token}"),
		metric.WithDescription("Tokens used per model call, by gen_ai.token.type (input, output, cache_read, cache_write)."),
		metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576))
	out.step, errs[1] = m.Float64Histogram(MetricStepDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of one agent step: the model call plus its tool calls."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	out.firstChunk, errs[2] = m.Float64Histogram(MetricTimeToFirstChunk, metric.WithUnit("s"),
		metric.WithDescription("Time from sending a model request to its first stream chunk."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	out.tool, errs[3] = m.Float64Histogram(MetricToolDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of one tool call's execution."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	out.active, errs[4] = m.Int64UpDownCounter(MetricActiveSessions, metric.WithUnit("{session}"),
		metric.WithDescription("Sessions loaded in memory by the agent service."))
	out.publishLag, errs[5] = m.Float64Histogram(MetricPublishLag, metric.WithUnit("s"),
		metric.WithDescription("Time from an event being durable to JetStream acknowledging it."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	out.denials, errs[6] = m.Int64Counter(MetricAuthDenials, metric.WithUnit("{request}"),
		metric.WithDescription("Requests refused by authentication or authorization, by rpc.method and rpc.grpc.status_code."))
	out.oversize, errs[7] = m.Int64Counter(MetricOversizeEvents, metric.WithUnit("{event}"),
		metric.WithDescription("Events over the NATS server's max_payload, published as references (the consumer fetches them from the agent)."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return out, nil
}

// RecordTokens records the usage of one model call.
func (m *Metrics) RecordTokens(ctx context.Context, provider, model string, u *llmv1.TokenUsage) {
	if m == nil || u == nil {
		return
	}
	base := []attribute.KeyValue{semconv.GenAIOperationNameChat, semconv.GenAIProviderNameKey.String(provider), semconv.GenAIRequestModel(model)}
	rec := func(kind string, n int64) {
		m.tokens.Record(ctx, n, metric.WithAttributes(append(base, semconv.GenAITokenTypeKey.String(kind))...))
	}
	rec("input", u.GetInputTokens())
	rec("output", u.GetOutputTokens())
	if u.CacheReadTokens != nil {
		rec("cache_read", u.GetCacheReadTokens())
	}
	if u.CacheWriteTokens != nil {
		rec("cache_write", u.GetCacheWriteTokens())
	}
}

// RecordStep records one step's duration.
func (m *Metrics) RecordStep(ctx context.Context, d time.Duration, provider, model string) {
	if m == nil {
		return
	}
	m.step.Record(ctx, d.Seconds(), m.stepOption(provider, model))
}

// maxStepOptions bounds the step attribute options kept: provider and model
// names come from sessions' options, and past this many pairs a step's
// option is built per call as before.
const maxStepOptions = 64

// stepOption is the attribute option of a step's duration under provider
// and model, built once per pair: metric.WithAttributes builds, sorts and
// copies an attribute set per call, and nearly every step of a node shares
// one of a few pairs.
func (m *Metrics) stepOption(provider, model string) metric.MeasurementOption {
	key := [2]string{provider, model}
	if o, ok := m.stepOpts.Load(key); ok {
		return o.(metric.MeasurementOption)
	}
	o := metric.WithAttributeSet(attribute.NewSet(semconv.GenAIProviderNameKey.String(provider), semconv.GenAIRequestModel(model)))
	if m.stepOptsN.Load() < maxStepOptions {
		if _, loaded := m.stepOpts.LoadOrStore(key, o); !loaded {
			m.stepOptsN.Add(1)
		}
	}
	return o
}

// RecordTimeToFirstChunk records the wait for a model call's first chunk.
func (m *Metrics) RecordTimeToFirstChunk(ctx context.Context, d time.Duration, provider, model string) {
	if m == nil {
		return
	}
	m.firstChunk.Record(ctx, d.Seconds(), metric.WithAttributes(semconv.GenAIProviderNameKey.String(provider), semconv.GenAIRequestModel(model)))
}

// RecordTool records one tool call's duration.
func (m *Metrics) RecordTool(ctx context.Context, d time.Duration, name string, isError bool) {
	if m == nil {
		return
	}
	m.tool.Record(ctx, d.Seconds(), metric.WithAttributes(semconv.GenAIToolName(name), ToolIsErrorKey.Bool(isError)))
}

// SessionLoaded adds delta (+1 loaded, -1 unloaded) to the active sessions.
func (m *Metrics) SessionLoaded(ctx context.Context, delta int64) {
	if m == nil {
		return
	}
	m.active.Add(ctx, delta)
}

// RecordOversizeEvent counts an event published as a reference because it
// was over the NATS server's max_payload.
func (m *Metrics) RecordOversizeEvent(ctx context.Context) {
	if m == nil {
		return
	}
	m.oversize.Add(ctx, 1)
}

// RecordPublishLag records the time from durable to acknowledged by JetStream.
func (m *Metrics) RecordPublishLag(ctx context.Context, d time.Duration) {
	if m == nil {
		return
	}
	m.publishLag.Record(ctx, d.Seconds())
}

// RecordDenial counts one request refused at the trust boundary: rpc is the
// full gRPC method, code the status code name (Unauthenticated,
// PermissionDenied).
func (m *Metrics) RecordDenial(ctx context.Context, rpc, code string) {
	if m == nil {
		return
	}
	m.denials.Add(ctx, 1, metric.WithAttributes(semconv.RPCMethod(rpc), attribute.String("rpc.grpc.status_code", code)))
}
