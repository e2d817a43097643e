package llmgateway

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

func TestGetModelContextCompaction(t *testing.T) {
	t.Parallel()
	route := RouteConfig{Name: "small", Kind: KindScripted,
		Models: []provider.Model{{ID: "tiny", ContextWindow: 4000}, {ID: "big", ContextWindow: 200_000}, {ID: "nowindow"}},
		Compaction: &CompactionConfig{ThresholdRatio: proto.Float64(0.7), MaxTokens: proto.Int32(1024),
			Models: map[string]*CompactionConfig{"big": {ThresholdRatio: proto.Float64(0.9), Model: "tiny", Disabled: true}}}}
	s, err := New(Config{Routes: []RouteConfig{route, {Name: "plain", Kind: KindScripted}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := handler{s: s}
	tests := []struct {
		route, model string
		want         *llmv1.ModelContext
	}{
		{"small", "tiny", &llmv1.ModelContext{ContextWindow: 4000, Compaction: &llmv1.CompactionPolicy{ThresholdRatio: proto.Float64(0.7), MaxTokens: proto.Int32(1024)}}},
		{"small", "big", &llmv1.ModelContext{ContextWindow: 200_000, Compaction: &llmv1.CompactionPolicy{ThresholdRatio: proto.Float64(0.9), MaxTokens: proto.Int32(1024), Model: "tiny", Disabled: true}}},
		// the window is unknown: reported as such (0), never guessed
		{"small", "nowindow", &llmv1.ModelContext{Compaction: &llmv1.CompactionPolicy{ThresholdRatio: proto.Float64(0.7), MaxTokens: proto.Int32(1024)}}},
		{"plain", "scripted", nil},
	}
	for _, tc := range tests {
		got, err := h.GetModelContext(t.Context(), &llmv1.GetModelContextRequest{Provider: tc.route, Model: tc.model})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got.GetContext(), protocmp.Transform()); diff != "" {
			t.Errorf("%s/%s (-want +got):\n%s", tc.route, tc.model, diff)
		}
	}
}

func TestCompactionConfigRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		c    *CompactionConfig
		want string
	}{
		{&CompactionConfig{ThresholdRatio: proto.Float64(1.5)}, "threshold_ratio 1.5 must be in (0, 1]"},
		{&CompactionConfig{RetainRatio: proto.Float64(0)}, "retain_ratio 0 must be in (0, 1]"},
		{&CompactionConfig{MaxTokens: proto.Int32(0)}, "max_tokens must be positive"},
		{&CompactionConfig{Retries: proto.Int32(-1)}, "retries must not be negative"},
		{&CompactionConfig{Models: map[string]*CompactionConfig{"m": {RetainTokens: proto.Int64(-5)}}}, "models.m: compaction retain_tokens"},
		{&CompactionConfig{Models: map[string]*CompactionConfig{"m": {Models: map[string]*CompactionConfig{"x": {}}}}}, "do not nest"},
	}
	for _, tc := range tests {
		_, err := New(Config{Routes: []RouteConfig{{Name: "r", Kind: KindScripted, Compaction: tc.c}}}, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "route r") {
			t.Errorf("New with %+v: %v, want an error naming route r and %q", tc.c, err, tc.want)
		}
	}
}

// TestCompactionConfigNullModel: a config file's "models": {"m": null}
// (a nil override) starts the gateway like no override at all.
func TestCompactionConfigNullModel(t *testing.T) {
	t.Parallel()
	c := &CompactionConfig{ThresholdRatio: proto.Float64(0.5), Models: map[string]*CompactionConfig{"m": nil}}
	if _, err := New(Config{Routes: []RouteConfig{{Name: "r", Kind: KindScripted, Compaction: c}}}, nil); err != nil {
		t.Fatalf("New with a null per-model override: %v", err)
	}
}
