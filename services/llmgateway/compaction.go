package llmgateway

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// CompactionConfig overrides the agent's compaction settings for a route
// (RouteConfig.Compaction) and, through Models, for one of its models
// (semantics.md §7.6 modelPolicies). Unset fields keep the agent's
// defaults; a model's fields override the route's. GetModelContext reports
// the merged policy.
type CompactionConfig struct {
	// ThresholdRatio is the pressure threshold as a share of the window.
	ThresholdRatio *float64 `json:"threshold_ratio,omitempty"`
	// RetainRatio is the share of the window kept as the recent tail.
	RetainRatio *float64 `json:"retain_ratio,omitempty"`
	// RetainTokens is the recent tail in tokens (overrides RetainRatio).
	RetainTokens *int64 `json:"retain_tokens,omitempty"`
	// MaxTokens caps the summarization call's output.
	MaxTokens *int32 `json:"max_tokens,omitempty"`
	// Retries of a failed or non-shrinking summary.
	Retries *int32 `json:"retries,omitempty"`
	// Provider and Model route the summarization call (default the
	// session's).
	Provider string `json:"provider,omitempty"`
	Model    string `json:"model,omitempty"`
	// Disabled turns automatic compaction off.
	Disabled bool `json:"disabled,omitempty"`
	// Models holds per-model overrides (route level only).
	Models map[string]*CompactionConfig `json:"models,omitempty"`
}

// validate reports a setting no compaction could honour.
func (c *CompactionConfig) validate(where string) error {
	if c == nil {
		return nil
	}
	ratio := func(name string, v *float64) error {
		if v != nil && (*v <= 0 || *v > 1) {
			return fmt.Errorf("%s: compaction %s %v must be in (0, 1]", where, name, *v)
		}
		return nil
	}
	if err := ratio("threshold_ratio", c.ThresholdRatio); err != nil {
		return err
	}
	if err := ratio("retain_ratio", c.RetainRatio); err != nil {
		return err
	}
	switch {
	case c.RetainTokens != nil && *c.RetainTokens < 0:
		return fmt.Errorf("%s: compaction retain_tokens must not be negative", where)
	case c.MaxTokens != nil && *c.MaxTokens <= 0:
		return fmt.Errorf("%s: compaction max_tokens must be positive", where)
	case c.Retries != nil && *c.Retries < 0:
		return fmt.Errorf("%s: compaction retries must not be negative", where)
	}
	for m, mc := range c.Models {
		if mc == nil { // "models": {"m": null}: no override
			continue
		}
		if len(mc.Models) > 0 {
			return fmt.Errorf("%s: compaction models.%s: per-model overrides do not nest", where, m)
		}
		if err := mc.validate(where + ": compaction models." + m); err != nil {
			return err
		}
	}
	return nil
}

// policy merges the route's settings with model's overrides into the
// reported policy; nil when nothing is configured.
func (c *CompactionConfig) policy(model string) *llmv1.CompactionPolicy {
	if c == nil {
		return nil
	}
	p := &llmv1.CompactionPolicy{}
	for _, layer := range []*CompactionConfig{c, c.Models[model]} {
		if layer == nil {
			continue
		}
		if layer.ThresholdRatio != nil {
			p.ThresholdRatio = proto.Float64(*layer.ThresholdRatio)
		}
		if layer.RetainRatio != nil {
			p.RetainRatio = proto.Float64(*layer.RetainRatio)
		}
		if layer.RetainTokens != nil {
			p.RetainTokens = proto.Int64(*layer.RetainTokens)
		}
		if layer.MaxTokens != nil {
			p.MaxTokens = proto.Int32(*layer.MaxTokens)
		}
		if layer.Retries != nil {
			p.Retries = proto.Int32(*layer.Retries)
		}
		if layer.Provider != "" {
			p.Provider = layer.Provider
		}
		if layer.Model != "" {
			p.Model = layer.Model
		}
		p.Disabled = p.Disabled || layer.Disabled
	}
	return p
}

// modelContext answers GetModelContext for a route: the model's window from
// the route's catalogue (0 when unknown) and the merged compaction policy;
// nil when neither is known.
func (r *route) modelContext(model string) *llmv1.ModelContext {
	out := &llmv1.ModelContext{Compaction: r.compaction.policy(model)}
	for _, m := range r.adapter.Models() {
		if m.ID == model {
			out.ContextWindow = m.ContextWindow
			break
		}
	}
	if out.ContextWindow == 0 && out.Compaction == nil {
		return nil
	}
	return out
}
