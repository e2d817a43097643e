package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// RetryEventType is the log-only event the retry policy appends before it
// waits.
const RetryEventType = "llm/retry"

// RetryPolicy is the dsh-llm-retry listener of agent/request-error
// (semantics.md §2.7). Its zero value is not usable; start from
// DefaultRetryPolicy.
type RetryPolicy struct {
	// Codes are the failure codes this policy retries.
	Codes []string
	// MaxRetries bounds consecutive retries of this policy's own codes.
	MaxRetries int
	// Base is the first backoff; each retry doubles it up to Cap.
	Base, Cap time.Duration
	// Jitter is the relative spread of the backoff (0.1 = ±10 %).
	Jitter float64
	// Sleep waits d or until ctx ends. Injected by tests.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a number in [0, 1). Injected by tests.
	Rand func() float64
}

// DefaultRetryPolicy is 2 retries of RATE_LIMIT, SERVER, TIMEOUT and
// TRANSPORT with exponential backoff from 500 ms to 10 s and 10 % jitter.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		Codes:      []string{"RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"},
		MaxRetries: 2,
		Base:       500 * time.Millisecond,
		Cap:        10 * time.Second,
		Jitter:     0.1,
		Sleep:      SleepContext,
		Rand:       rand.Float64,
	}
}

// SleepContext waits d or until ctx ends, returning the context's cause.
func SleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// retryRecord is the llm/retry payload.
type retryRecord struct {
	Turn       int32         `json:"turn"`
	Step       int32         `json:"step"`
	Retry      int           `json:"retry"`
	MaxRetries int           `json:"maxRetries"`
	DelayMs    int64         `json:"delayMs"`
	Failure    failureRecord `json:"failure"`
}

type failureRecord struct {
	Message              string  `json:"message"`
	Code                 string  `json:"code"`
	Status               *int32  `json:"status,omitempty"`
	ProviderRetryAfterMs *int64  `json:"providerRetryAfterMs,omitempty"`
	RequestID            *string `json:"requestId,omitempty"`
}

func recordOf(f *llmv1.LlmFailure) failureRecord {
	return failureRecord{Message: f.GetMessage(), Code: f.GetCode(), Status: f.Status,
		ProviderRetryAfterMs: f.ProviderRetryAfterMs, RequestID: f.RequestId}
}

// Delay is the wait before retry number n (0-based count of this policy's
// earlier failures), and false when the policy delegates instead.
func (p RetryPolicy) Delay(f *llmv1.LlmFailure, n int) (time.Duration, bool) {
	if ra := f.GetProviderRetryAfterMs(); ra > 0 {
		d := time.Duration(ra) * time.Millisecond
		if d > p.Cap {
			return 0, false
		}
		return d, true
	}
	backoff := float64(p.Base) * math.Pow(2, float64(n))
	if backoff > float64(p.Cap) {
		backoff = float64(p.Cap)
	}
	r := 0.5
	if p.Rand != nil {
		r = p.Rand()
	}
	d := time.Duration(backoff * (1 + p.Jitter*(2*r-1)))
	return min(d, p.Cap), true
}

// Link returns the policy as an agent/request-error link.
func (p RetryPolicy) Link() Link[*RequestError, *agentv1.RequestErrorDecision] {
	return func(ctx context.Context, in *RequestError, next Next[*RequestError, *agentv1.RequestErrorDecision]) (*agentv1.RequestErrorDecision, error) {
		code := in.Failure.GetCode()
		if !slices.Contains(p.Codes, code) {
			return next(ctx, in)
		}
		prior := 0
		for _, f := range in.PriorFailures {
			if slices.Contains(p.Codes, f.GetCode()) {
				prior++
			}
		}
		if prior >= p.MaxRetries {
			return next(ctx, in)
		}
		delay, ok := p.Delay(in.Failure, prior)
		if !ok {
			return next(ctx, in)
		}
		rec := retryRecord{Turn: in.Turn, Step: in.Step, Retry: prior + 1, MaxRetries: p.MaxRetries,
			DelayMs: delay.Milliseconds(), Failure: recordOf(in.Failure)}
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, fmt.Errorf("llm/retry record: %w", err)
		}
		if in.Append != nil {
			ev := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_Extension{
				Extension: &llmv1.Extension{Type: RetryEventType, Json: string(b)}}}
			if err := in.Append(ev); err != nil {
				return nil, fmt.Errorf("append llm/retry: %w", err)
			}
		}
		sleep := p.Sleep
		if sleep == nil {
			sleep = SleepContext
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, err
		}
		return Retry(), nil
	}
}
