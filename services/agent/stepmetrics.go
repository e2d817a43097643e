package agent

import (
	"context"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// stepTimer records each step's duration (dsh.step.duration: step/start to
// step/end, model call and tools included) from the events a session
// flushes; it is used under the session's flushMu.
type stepTimer struct {
	start int64 // time of the last step/start flushed, 0 when none is open
}

// observe records the steps that evs (just made durable) close, under the
// session's effective provider and model (opts: after UpdateSession).
func (t *stepTimer) observe(m *telemetry.Metrics, opts *sessionv1.SessionOptions, evs []*sessionv1.SessionEvent) {
	if m == nil {
		return
	}
	for _, ev := range evs {
		switch {
		case ev.GetStepStart() != nil:
			t.start = ev.GetTime()
		case ev.GetStepEnd() != nil && t.start > 0:
			m.RecordStep(context.Background(), time.Duration(ev.GetTime()-t.start)*time.Millisecond,
				opts.GetProvider(), opts.GetModel())
			t.start = 0
		}
	}
}
