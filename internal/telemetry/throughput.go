package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// Throughput metric names (issue 19): the store's group commit and the
// gateway's chunk rate.
const (
	MetricStoreCommitRequests = "dsh.store.commit.requests"
	MetricStoreCommitDuration = "dsh.store.commit.duration"
	MetricStoreWriteDuration  = "dsh.store.write.duration"
	MetricStoreQueue          = "dsh.store.queue"
	MetricGatewayChunks       = "dsh.gateway.chunks"
)

// StoreMetrics are the instruments of a store's write path. A nil
// *StoreMetrics records nothing.
type StoreMetrics struct {
	requests metric.Int64Histogram
	commit   metric.Float64Histogram
	write    metric.Float64Histogram
}

// NewStoreMetrics creates the instruments on mp (nil: the global provider).
// queue, when set, reports the writes waiting for the committer; it is read
// at each collection.
func NewStoreMetrics(mp metric.MeterProvider, queue func() int64) (*StoreMetrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	m := &StoreMetrics{}
	var errs [4]error
	m.requests, errs[0] = meter.Int64Histogram(MetricStoreCommitRequests, metric.WithUnit("{write}"),
		metric.WithDescription("Writes (appends of different sessions, cursor raises) sharing one store transaction and fsync: the group-commit batch size."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
	m.commit, errs[1] = meter.Float64Histogram(MetricStoreCommitDuration, metric.WithUnit("s"),
		metric.WithDescription("One group transaction, begin to durable commit."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	m.write, errs[2] = meter.Float64Histogram(MetricStoreWriteDuration, metric.WithUnit("s"),
		metric.WithDescription("One write from its submission to its durable commit (queue wait included): the latency of a flush."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	if queue != nil {
		_, errs[3] = meter.Int64ObservableGauge(MetricStoreQueue, metric.WithUnit("{write}"),
			metric.WithDescription("Writes waiting for the store's committer."),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				o.Observe(queue())
				return nil
			}))
	}
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return m, nil
}

// RecordCommit records one group commit of requests writes taking d, and
// each write's wait from submission to commit.
func (m *StoreMetrics) RecordCommit(ctx context.Context, requests int, d time.Duration, waits []time.Duration) {
	if m == nil {
		return
	}
	m.requests.Record(ctx, int64(requests))
	m.commit.Record(ctx, d.Seconds())
	for _, w := range waits {
		m.write.Record(ctx, w.Seconds())
	}
}

// NewChunkCounter is the gateway's count of stream chunks sent to clients
// (its rate is the chunk rate), on mp (nil: the global provider).
func NewChunkCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName).Int64Counter(MetricGatewayChunks, metric.WithUnit("{chunk}"),
		metric.WithDescription("Stream chunks the gateway sent to its clients."))
}
