package agent

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// TestStepTimer: a step's duration is recorded when its step/end is
// flushed, from the step/start of an earlier flush, in seconds.
func TestStepTimer(t *testing.T) {
	reader := metric.NewManualReader()
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	m, err := telemetry.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	h := &sessionv1.SessionHeader{Id: "s", Options: &sessionv1.SessionOptions{Provider: "p", Model: "m"}}
	start, end := session.StepStartEvent(1, 1), session.StepEndEvent(1, 1)
	start.Time, end.Time = 1_000, 1_250
	var st stepTimer
	st.observe(m, h.GetOptions(), []*sessionv1.SessionEvent{start}) // flush before the model call
	st.observe(m, h.GetOptions(), []*sessionv1.SessionEvent{end})
	st.observe(m, h.GetOptions(), []*sessionv1.SessionEvent{end}) // no open step: nothing
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != telemetry.MetricStepDuration {
				continue
			}
			dp := mt.Data.(metricdata.Histogram[float64]).DataPoints
			if len(dp) != 1 || dp[0].Count != 1 || dp[0].Sum != 0.25 {
				t.Fatalf("step durations %+v, want one of 0.25 s", dp)
			}
			return
		}
	}
	t.Fatal("no step duration recorded")
}
