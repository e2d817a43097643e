// Package openai is the adapter for any OpenAI-compatible chat-completions
// server (OpenAI itself, vLLM, Ollama, llama.cpp server, LM Studio). It asks
// for usage with stream_options.include_usage and accepts it in a trailing
// usage-only chunk, in the last delta, or not at all; it reads reasoning from
// reasoning_content or reasoning; user messages may carry images.
package openai

import (
	"net/url"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/chat"
)

// DefaultBaseURL is OpenAI's API root.
const DefaultBaseURL = "https://api.openai.com/v1"

// dialect is generic OpenAI-compatible chat completions.
var dialect = chat.Dialect{
	Kind:             "openai",
	Images:           true,
	RequestIDHeaders: []string{"x-request-id"},
}

// New returns an OpenAI-compatible adapter. An empty BaseURL means
// DefaultBaseURL. Requests to OpenAI's own API send the output limit as
// max_completion_tokens (its reasoning models reject max_tokens); other
// servers get max_tokens, which all of them accept.
func New(cfg chat.Config) *chat.Adapter {
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if cfg.Route == "" {
		cfg.Route = "openai"
	}
	d := dialect
	if u, err := url.Parse(cfg.BaseURL); err == nil && u.Hostname() == "api.openai.com" {
		d.MaxCompletionTokens = true
	}
	return chat.New(d, cfg)
}
