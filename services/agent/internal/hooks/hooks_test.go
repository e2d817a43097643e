package hooks_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
)

func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	ra := func(ms int64) *int64 { return &ms }
	rl := &llmv1.LlmFailure{Code: "RATE_LIMIT", Message: "slow"}
	tests := []struct {
		name      string
		failure   *llmv1.LlmFailure
		prior     []*llmv1.LlmFailure
		wantRetry bool
		wantDelay time.Duration
	}{
		{"first retry", rl, nil, true, 500 * time.Millisecond},
		{"second retry doubles", rl, []*llmv1.LlmFailure{rl}, true, time.Second},
		{"exhausted delegates", rl, []*llmv1.LlmFailure{rl, rl}, false, 0},
		{"other codes do not count", rl, []*llmv1.LlmFailure{{Code: "AUTH", Message: "x"}, {Code: "QUOTA", Message: "x"}}, true, 500 * time.Millisecond},
		{"not retryable", &llmv1.LlmFailure{Code: "AUTH", Message: "no"}, nil, false, 0},
		{"retry-after within cap", &llmv1.LlmFailure{Code: "SERVER", Message: "x", ProviderRetryAfterMs: ra(3000)}, nil, true, 3 * time.Second},
		{"retry-after over cap delegates", &llmv1.LlmFailure{Code: "SERVER", Message: "x", ProviderRetryAfterMs: ra(60000)}, nil, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var slept []time.Duration
			var logged []*sessionv1.SessionEvent
			p := hooks.DefaultRetryPolicy()
			p.Rand = func() float64 { return 0.5 }
			p.Sleep = func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }
			var set hooks.Set
			set.RequestError.Use(p.Link())
			d, err := set.RequestError.Run(t.Context(), &hooks.RequestError{Turn: 1, Step: 2, Failure: tc.failure, PriorFailures: tc.prior,
				Append: func(ev *sessionv1.SessionEvent) error { logged = append(logged, ev); return nil }},
				func(context.Context, *hooks.RequestError) (*agentv1.RequestErrorDecision, error) {
					return hooks.Fail(), nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if (d.GetRetry() != nil) != tc.wantRetry {
				t.Fatalf("decision %v", d)
			}
			if tc.wantRetry {
				if len(slept) != 1 || slept[0] != tc.wantDelay || len(logged) != 1 || logged[0].GetExtension().GetType() != hooks.RetryEventType {
					t.Errorf("slept %v, logged %v", slept, logged)
				}
			} else if len(slept)+len(logged) != 0 {
				t.Errorf("delegated but slept %v / logged %v", slept, logged)
			}
		})
	}
	t.Run("jitter stays within 10%", func(t *testing.T) {
		p := hooks.DefaultRetryPolicy()
		for _, r := range []float64{0, 0.999999} {
			p.Rand = func() float64 { return r }
			d, _ := p.Delay(rl, 0)
			if d < 450*time.Millisecond || d > 550*time.Millisecond {
				t.Errorf("rand %v: delay %v", r, d)
			}
		}
	})
	t.Run("cancellation aborts the wait", func(t *testing.T) {
		p := hooks.DefaultRetryPolicy()
		ctx, cancel := context.WithCancelCause(t.Context())
		cause := errors.New("user")
		cancel(cause)
		_, err := p.Link()(ctx, &hooks.RequestError{Failure: rl}, nil)
		if !errors.Is(err, cause) {
			t.Errorf("err %v, want the cancel cause", err)
		}
	})
}

func TestChainOrderAndPanics(t *testing.T) {
	t.Parallel()
	var c hooks.Chain[string, string]
	c.Use(func(ctx context.Context, in string, next hooks.Next[string, string]) (string, error) {
		out, err := next(ctx, in+"a")
		return out + "A", err
	})
	c.Use(func(ctx context.Context, in string, next hooks.Next[string, string]) (string, error) {
		return next(ctx, in+"b")
	})
	got, err := c.Run(t.Context(), "", func(_ context.Context, in string) (string, error) { return in + "!", nil })
	if err != nil || got != "ab!A" {
		t.Errorf("got %q %v", got, err)
	}
	c.Use(func(context.Context, string, hooks.Next[string, string]) (string, error) { panic("boom") })
	if _, err := c.Run(t.Context(), "", nil); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic not contained: %v", err)
	}
}
