package mcpbridge_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/google/go-cmp/cmp"
)

// The config formats users already have parse into the same servers:
// testdata/config/<client>.json → <client>.golden (the parsed servers and
// the notes of what was ignored). UPDATE_GOLDEN=1 rewrites the goldens.
func TestConfigFormatsGolden(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/config/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			c, err := mcpbridge.LoadConfig(f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(struct {
				Servers map[string]mcpbridge.ServerConfig `json:"servers"`
				Notes   []string                          `json:"notes,omitempty"`
			}{c.Servers, c.Notes}, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(f, ".json") + ".golden"
			if os.Getenv("UPDATE_GOLDEN") == "1" {
				if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(strings.TrimSpace(string(want)), string(got)); diff != "" {
				t.Errorf("%s (-golden +got):\n%s", f, diff)
			}
		})
	}
}

func FuzzParseConfig(f *testing.F) {
	files, _ := filepath.Glob("testdata/config/*.json")
	for _, p := range files {
		b, _ := os.ReadFile(p)
		f.Add(b)
	}
	f.Add([]byte(`{"servers":{"a":{"type":"sse","command":"x"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := mcpbridge.ParseConfig(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted a config that does not validate: %v", err)
		}
		for _, n := range c.Names() {
			if strings.Contains(n, mcpbridge.Separator) {
				t.Fatalf("accepted server name %q", n)
			}
		}
	})
}
