// Package llmgateway serves dsh.llm.v1.LlmGateway: the one streaming API in
// front of every model provider. It is stateless but for a cache of
// remembered conversations (GenerateRequest.prefix: losing it costs the
// caller a resend, never a result); each Generate call is exactly one
// provider attempt (retries are the agent's decision, because a retry is a
// new durable step), normalised to the StreamChunk protocol.
//
// Routes are registered from Config: a route name selects an adapter
// instance of a kind (deepseek, openai, anthropic, scripted). ConfigFromEnv
// builds the conventional configuration: a route per provider whose key (or,
// for openai, base URL) is set, and the scripted route always, running the
// built-in demo script unless DSH_SCRIPT names another.
//
// # Delivery
//
// Every Generate stream that passed validation ends with exactly one finish
// chunk; failures after acceptance are finish{error|aborted, LlmFailure},
// never a gRPC error. gRPC errors are reserved for requests that are
// themselves wrong (INVALID_ARGUMENT, NOT_FOUND), and then nothing is sent
// upstream.
//
// # Shutdown
//
// Cancelling a Generate RPC cancels its upstream HTTP request at once.
// Close releases idle provider connections; call it after the gRPC server
// stopped.
package llmgateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/anthropic"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/chat"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/deepseek"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/memo"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/openai"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/prefix"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/scripted"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
)

// The adapter kinds.
const (
	KindDeepSeek  = "deepseek"
	KindOpenAI    = "openai"
	KindAnthropic = "anthropic"
	KindScripted  = "scripted"
)

// Config configures the gateway.
type Config struct {
	// Routes are registered in order; names must be unique.
	Routes []RouteConfig `json:"routes"`
	// IdleTimeout bounds each wait on a provider (TIMEOUT after it);
	// 5 minutes when zero.
	IdleTimeout time.Duration `json:"-"`
	// Version goes into the User-Agent "dsh/<version> (+url)"; "dev" when
	// empty.
	Version string `json:"-"`
	// HTTPClient sends provider requests; a client on a tuned transport
	// when nil. It must not retry or follow a timeout of its own.
	HTTPClient *http.Client `json:"-"`
	// Now is the clock (Retry-After dates); time.Now when nil.
	Now func() time.Time `json:"-"`
	// PrefixCacheBytes bounds the remembered conversations
	// (GenerateRequest.prefix); DefaultPrefixCacheBytes when zero, none
	// remembered when negative (every reference then misses).
	PrefixCacheBytes int64 `json:"-"`
	// PrefixCacheTenantBytes bounds one tenant's share of them; the whole
	// bound when zero.
	PrefixCacheTenantBytes int64 `json:"-"`
}

// newPrefixCache returns the remembered-conversation cache of cfg, or nil.
func newPrefixCache(cfg Config) *prefix.Cache {
	n := cfg.PrefixCacheBytes
	if n < 0 {
		return nil
	}
	if n == 0 {
		n = DefaultPrefixCacheBytes
	}
	return prefix.New(n, cfg.PrefixCacheTenantBytes)
}

// RouteConfig is one provider route.
type RouteConfig struct {
	// Name is the route key a GenerateRequest selects with provider.
	Name string `json:"name"`
	// Kind is the adapter kind: deepseek, openai, anthropic or scripted.
	Kind string `json:"kind"`
	// DisplayName is the human-readable name; Name when empty.
	DisplayName string `json:"display_name,omitempty"`
	// BaseURL is the API root; the kind's default when empty.
	BaseURL string `json:"base_url,omitempty"`
	// APIKey authenticates; never logged. In a config file, prefer
	// APIKeyEnv.
	APIKey string `json:"api_key,omitempty"`
	// APIKeyEnv names an environment variable holding the key (config
	// files).
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// Models is the advisory catalogue with context windows; the kind's
	// defaults when empty.
	Models []provider.Model `json:"models,omitempty"`
	// Thinking (deepseek): "enabled" or "disabled", sent as thinking:{type}.
	Thinking string `json:"thinking,omitempty"`
	// ReasoningEffort (deepseek, openai): sent as reasoning_effort.
	ReasoningEffort string `json:"reasoning_effort,omitempty"`
	// ThinkingBudget (anthropic): extended-thinking budget tokens; off when 0.
	ThinkingBudget int32 `json:"thinking_budget,omitempty"`
	// MaxTokens (anthropic): the output limit sent when a request has none.
	MaxTokens int32 `json:"max_tokens,omitempty"`
	// Script (scripted): a file path or inline JSON; the built-in demo when
	// empty.
	Script string `json:"script,omitempty"`
	// Compaction overrides the agent's compaction settings on this route
	// (and per model); reported by GetModelContext.
	Compaction *CompactionConfig `json:"compaction,omitempty"`
	// NoImages (openai): the model behind this OpenAI-compatible server
	// reads no images (a text-only model on vLLM, Ollama, llama.cpp): images
	// are described to it instead (see docs/arch/llmgateway.md).
	NoImages bool `json:"no_images,omitempty"`
}

// EnvVar is one environment variable ConfigFromEnv reads.
type EnvVar struct{ Name, Doc string }

// EnvVars lists the variables ConfigFromEnv reads, for --help (a test keeps
// the two in step).
func EnvVars() []EnvVar {
	return []EnvVar{
		{"DEEPSEEK_API_KEY", "registers the deepseek route"},
		{"DEEPSEEK_BASE_URL", "its endpoint (default the public API)"},
		{"ANTHROPIC_API_KEY", "registers the anthropic route"},
		{"ANTHROPIC_BASE_URL", "its endpoint (default the public API)"},
		{"OPENAI_API_KEY", "registers the openai route (OpenAI or any compatible server)"},
		{"OPENAI_BASE_URL", "its endpoint; alone (no key) for vLLM, Ollama, llama.cpp"},
		{"OPENAI_MODEL", "the openai route's model (default: the server's /v1/models)"},
		{"DSH_SCRIPT", "the scripted route's script: a file or inline JSON (default the offline demo)"},
		{"DSH_LLM_IDLE_TIMEOUT", "provider stream idle bound, e.g. 90s (a bare number is seconds; default 5m)"},
	}
}

// ConfigFromEnv builds the conventional configuration from environment
// variables: DEEPSEEK_API_KEY (+ DEEPSEEK_BASE_URL), ANTHROPIC_API_KEY
// (+ ANTHROPIC_BASE_URL), OPENAI_API_KEY and/or OPENAI_BASE_URL, each
// registering its route; the scripted route always (DSH_SCRIPT: a script
// file or inline JSON, default the demo); DSH_LLM_IDLE_TIMEOUT (a
// duration, as cmdline.Env reads it; zero or negative: the default). A
// DSH_LLM_IDLE_TIMEOUT that is not a duration is an error naming it.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	if k := getenv("DEEPSEEK_API_KEY"); k != "" {
		cfg.Routes = append(cfg.Routes, RouteConfig{Name: "deepseek", Kind: KindDeepSeek, DisplayName: "DeepSeek", APIKey: k, BaseURL: getenv("DEEPSEEK_BASE_URL")})
	}
	if k := getenv("ANTHROPIC_API_KEY"); k != "" {
		cfg.Routes = append(cfg.Routes, RouteConfig{Name: "anthropic", Kind: KindAnthropic, DisplayName: "Anthropic", APIKey: k, BaseURL: getenv("ANTHROPIC_BASE_URL")})
	}
	if k, u := getenv("OPENAI_API_KEY"), getenv("OPENAI_BASE_URL"); k != "" || u != "" {
		r := RouteConfig{Name: "openai", Kind: KindOpenAI, DisplayName: "OpenAI-compatible", APIKey: k, BaseURL: u}
		if m := getenv("OPENAI_MODEL"); m != "" {
			r.Models = []provider.Model{{ID: m}}
		}
		cfg.Routes = append(cfg.Routes, r)
	}
	scripted := RouteConfig{Name: "scripted", Kind: KindScripted, DisplayName: "Scripted (offline demo, no model)", Script: getenv("DSH_SCRIPT")}
	if scripted.Script == "" {
		scripted.Compaction = DemoCompaction()
	}
	cfg.Routes = append(cfg.Routes, scripted)
	// Unset, IdleTimeout stays zero (upstream.DefaultIdleTimeout), so that
	// a config file's idle_timeout applies.
	env := cmdline.NewEnv(getenv)
	if getenv("DSH_LLM_IDLE_TIMEOUT") != "" {
		if d := env.Duration("DSH_LLM_IDLE_TIMEOUT", upstream.DefaultIdleTimeout); d > 0 {
			cfg.IdleTimeout = d
		}
	}
	return cfg, env.Err()
}

// DemoCompaction is the demo route's compaction policy: on its small window
// it compacts at 30 % of it and keeps 300 tokens as the recent tail, so a
// chat of a few turns shows a compaction (make run) while the system prompt
// and tools (about 2,600 tokens) stay well inside the window.
func DemoCompaction() *CompactionConfig {
	threshold, retain := 0.3, int64(300)
	return &CompactionConfig{ThresholdRatio: &threshold, RetainTokens: &retain}
}

// LoadConfigFile reads a JSON config file ({"routes": [...],
// "idle_timeout": "5m"}) and merges its routes into base: a file route
// replaces a base route of the same name, others are appended (before the
// scripted route of base, which stays last). APIKeyEnv is resolved with
// getenv.
func LoadConfigFile(path string, base Config, getenv func(string) string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return base, fmt.Errorf("llmgateway config: %w", err)
	}
	var file struct {
		Routes      []RouteConfig `json:"routes"`
		IdleTimeout string        `json:"idle_timeout"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return base, fmt.Errorf("llmgateway config %s: %w", path, err)
	}
	if file.IdleTimeout != "" {
		d, err := time.ParseDuration(file.IdleTimeout)
		if err != nil || d <= 0 {
			return base, fmt.Errorf("llmgateway config %s: idle_timeout %q is not a positive duration", path, file.IdleTimeout)
		}
		base.IdleTimeout = d
	}
	out := base
	out.Routes = append([]RouteConfig(nil), base.Routes...)
	for _, r := range file.Routes {
		if r.APIKeyEnv != "" && r.APIKey == "" {
			r.APIKey = getenv(r.APIKeyEnv)
		}
		replaced := false
		for i := range out.Routes {
			if out.Routes[i].Name == r.Name {
				out.Routes[i], replaced = r, true
			}
		}
		if !replaced {
			n := len(out.Routes)
			if n > 0 && out.Routes[n-1].Kind == KindScripted {
				out.Routes = append(out.Routes[:n-1], r, out.Routes[n-1])
			} else {
				out.Routes = append(out.Routes, r)
			}
		}
	}
	return out, nil
}

// route is one registered route.
type route struct {
	name, display string
	adapter       provider.Adapter
	compaction    *CompactionConfig
}

// Service is the LlmGateway implementation.
type Service struct {
	log       *slog.Logger
	routes    []*route
	byName    map[string]*route
	transport *http.Transport
	// objects remembers the tool schemas accepted as JSON objects.
	objects *memo.Memo[struct{}]
	// prefixes remembers conversations for GenerateRequest.prefix; nil
	// when off.
	prefixes *prefix.Cache
}

// maxSchemas bounds the tool schemas remembered as valid.
const maxSchemas = 4096

// New builds the gateway's routes. It fails on an unknown kind, a duplicate
// or empty route name, or a scripted route whose script does not parse.
func New(cfg Config, logger *slog.Logger) (*Service, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{log: logger, byName: map[string]*route{}, objects: memo.New(maxSchemas, jsonObject), prefixes: newPrefixCache(cfg)}
	hc := cfg.HTTPClient
	if hc == nil {
		s.transport = upstream.NewTransport()
		hc = &http.Client{Transport: s.transport}
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	client := upstream.Client{HTTP: hc, UserAgent: provider.DSH(cfg.Version).UserAgent(), IdleTimeout: cfg.IdleTimeout, Now: now}
	for _, rc := range cfg.Routes {
		if rc.Name == "" {
			return nil, errors.New("llmgateway: a route has no name")
		}
		if _, dup := s.byName[rc.Name]; dup {
			return nil, fmt.Errorf("llmgateway: route %q registered twice", rc.Name)
		}
		if err := rc.Compaction.validate("llmgateway: route " + rc.Name); err != nil {
			return nil, err
		}
		a, err := newAdapter(rc, client, logger)
		if err != nil {
			return nil, err
		}
		r := &route{name: rc.Name, display: rc.DisplayName, adapter: a, compaction: rc.Compaction}
		if r.display == "" {
			r.display = rc.Name
		}
		s.routes = append(s.routes, r)
		s.byName[rc.Name] = r
		logger.Info("llm route registered", "route", rc.Name, "kind", a.Kind())
	}
	return s, nil
}

// NewWithAdapters registers pre-built adapters under route names, in order
// (tests, and embedders with adapters of their own).
func NewWithAdapters(logger *slog.Logger, routes map[string]provider.Adapter, order ...string) (*Service, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{log: logger, byName: map[string]*route{}, objects: memo.New(maxSchemas, jsonObject), prefixes: newPrefixCache(Config{})}
	for _, name := range order {
		a, ok := routes[name]
		if !ok || name == "" {
			return nil, fmt.Errorf("llmgateway: no adapter for route %q", name)
		}
		if _, dup := s.byName[name]; dup {
			return nil, fmt.Errorf("llmgateway: route %q registered twice", name)
		}
		r := &route{name: name, display: name, adapter: a}
		s.routes = append(s.routes, r)
		s.byName[name] = r
	}
	return s, nil
}

func newAdapter(rc RouteConfig, client upstream.Client, log *slog.Logger) (provider.Adapter, error) {
	lg := log.With("route", rc.Name)
	switch rc.Kind {
	case KindDeepSeek, KindOpenAI:
		c := chat.Config{Route: rc.Name, BaseURL: rc.BaseURL, APIKey: rc.APIKey, Models: rc.Models, Thinking: rc.Thinking, ReasoningEffort: rc.ReasoningEffort, NoImages: rc.NoImages, Client: client, Logger: lg}
		if rc.Kind == KindDeepSeek {
			return deepseek.New(c), nil
		}
		return openai.New(c), nil
	case KindAnthropic:
		return anthropic.New(anthropic.Config{Route: rc.Name, BaseURL: rc.BaseURL, APIKey: rc.APIKey, Models: rc.Models, ThinkingBudget: rc.ThinkingBudget, MaxTokens: rc.MaxTokens, Client: client, Logger: lg}), nil
	case KindScripted:
		sc := scripted.Demo()
		if rc.Script != "" {
			var err error
			if sc, err = scripted.Load(rc.Script); err != nil {
				return nil, fmt.Errorf("llmgateway: route %q: %w", rc.Name, err)
			}
		}
		if len(rc.Models) > 0 {
			sc.Models = rc.Models
		}
		return scripted.New(sc), nil
	}
	return nil, fmt.Errorf("llmgateway: route %q: unknown kind %q (want deepseek, openai, anthropic or scripted)", rc.Name, rc.Kind)
}

// Close releases idle provider connections.
func (s *Service) Close() {
	if s.transport != nil {
		s.transport.CloseIdleConnections()
	}
}

// RouteNames lists the registered routes in registration order.
func (s *Service) RouteNames() []string {
	out := make([]string, len(s.routes))
	for i, r := range s.routes {
		out[i] = r.name
	}
	return out
}
