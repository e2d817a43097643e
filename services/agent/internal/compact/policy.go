// Package compact keeps a session's model context inside its window
// (semantics.md §7.6): the model-free tool-result pruning pass, the
// selection of the oldest whole surface units at balanced tool-pairing
// cuts, and the compaction protocol (compact/start → summarization call →
// compact/summary → checkpoint user/message with surface_op replace →
// compact/end, the log being the lock). A Compactor is shared by every
// session of an agent; the loop calls it after each step (pressure) and on
// CONTEXT_WINDOW_EXCEEDED (overflow recovery), the service for a manual
// Compact. Nothing here deletes an event: a compaction or a pruning only
// appends replace events, so the request equation keeps holding.
package compact

import (
	"cmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Defaults of Policy (semantics.md §7.6).
const (
	DefaultThresholdRatio = 0.8
	DefaultRetainRatio    = 0.16
	DefaultMaxTokens      = 8192
	DefaultRetries        = 1
	// DefaultPruneThresholdChars, DefaultPruneHeadChars and
	// DefaultPruneTailChars shape a pruned tool result: over the
	// threshold (text code points), it keeps the head and the tail.
	DefaultPruneThresholdChars = 8192
	DefaultPruneHeadChars      = 4096
	DefaultPruneTailChars      = 1024
)

// Policy is the effective compaction policy of one route/model: the
// agent's configuration overridden by the gateway's per-route/model
// CompactionPolicy.
type Policy struct {
	// ThresholdRatio: pressure compaction runs when the measured total is
	// at least floor(window × ThresholdRatio).
	ThresholdRatio float64
	// RetainRatio of the window is kept as the recent tail, unless
	// RetainTokens is set.
	RetainRatio  float64
	RetainTokens int64
	// MaxTokens caps the summarization call's output.
	MaxTokens int32
	// Retries of a failed or non-shrinking summary.
	Retries int
	// Provider and Model route the summarization call; empty: the
	// session's latest request header.
	Provider, Model string
	// Disabled turns automatic compaction (pressure and overflow) off; a
	// manual Compact still runs.
	Disabled bool
	// Prune configures the model-free pass; PruneDisabled skips it.
	PruneThresholdChars, PruneHeadChars, PruneTailChars int
	PruneDisabled                                       bool
}

// withDefaults fills the zero fields.
func (p Policy) withDefaults() Policy {
	p.ThresholdRatio = cmp.Or(p.ThresholdRatio, DefaultThresholdRatio)
	p.RetainRatio = cmp.Or(p.RetainRatio, DefaultRetainRatio)
	p.MaxTokens = cmp.Or(p.MaxTokens, DefaultMaxTokens)
	if p.Retries == 0 {
		p.Retries = DefaultRetries
	} else if p.Retries < 0 {
		p.Retries = 0
	}
	p.PruneThresholdChars = cmp.Or(p.PruneThresholdChars, DefaultPruneThresholdChars)
	p.PruneHeadChars = cmp.Or(p.PruneHeadChars, DefaultPruneHeadChars)
	p.PruneTailChars = cmp.Or(p.PruneTailChars, DefaultPruneTailChars)
	return p
}

// override applies a gateway CompactionPolicy (unset fields keep p's).
func (p Policy) override(o *llmv1.CompactionPolicy) Policy {
	if o == nil {
		return p
	}
	if o.ThresholdRatio != nil {
		p.ThresholdRatio = o.GetThresholdRatio()
	}
	if o.RetainRatio != nil {
		p.RetainRatio = o.GetRetainRatio()
	}
	if o.RetainTokens != nil {
		p.RetainTokens = o.GetRetainTokens()
	}
	if o.MaxTokens != nil {
		p.MaxTokens = o.GetMaxTokens()
	}
	if o.Retries != nil {
		p.Retries = int(o.GetRetries())
		if p.Retries == 0 {
			p.Retries = -1 // explicitly none (withDefaults reads 0 as unset)
		}
	}
	p.Provider = cmp.Or(o.GetProvider(), p.Provider)
	p.Model = cmp.Or(o.GetModel(), p.Model)
	p.Disabled = p.Disabled || o.GetDisabled()
	return p
}

// retain is the recent tail kept out of a compaction, in tokens.
func (p Policy) retain(window int64) int64 {
	if p.RetainTokens > 0 {
		return p.RetainTokens
	}
	return int64(float64(window) * p.RetainRatio)
}

// threshold is floor(window × ThresholdRatio).
func (p Policy) threshold(window int64) int64 { return int64(float64(window) * p.ThresholdRatio) }
