// Package deepseek is the adapter for the DeepSeek chat-completions API:
// reasoning_content streamed as reasoning blocks and passed back on
// assistant turns with tool calls (thinking mode requires it), prompt-cache
// hits subtracted from input so usage stays disjoint, and the
// x-deepseek-harness-compact header on compaction calls.
package deepseek

import (
	"github.com/dsh-dev/dsh/services/llmgateway/internal/chat"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// DefaultBaseURL is DeepSeek's API root.
const DefaultBaseURL = "https://api.deepseek.com"

// dialect is DeepSeek's flavour of chat completions.
var dialect = chat.Dialect{
	Kind:              "deepseek",
	ReasoningPassback: true,
	CompactionHeader:  "x-deepseek-harness-compact",
	RequestIDHeaders:  []string{"x-deepseek-request-id", "x-request-id"},
}

// DefaultModels is the catalogue when none is configured.
func DefaultModels() []provider.Model {
	return []provider.Model{
		{ID: "deepseek-v4-flash", Name: "DeepSeek V4 Flash", ContextWindow: 128_000},
		{ID: "deepseek-v4-pro", Name: "DeepSeek V4 Pro", ContextWindow: 128_000},
	}
}

// New returns a DeepSeek adapter. An empty BaseURL means DefaultBaseURL and
// an empty catalogue DefaultModels.
func New(cfg chat.Config) *chat.Adapter {
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if len(cfg.Models) == 0 {
		cfg.Models = DefaultModels()
	}
	if cfg.Route == "" {
		cfg.Route = "deepseek"
	}
	return chat.New(dialect, cfg)
}
