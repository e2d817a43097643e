package prompt

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// LoadConfig reads a deployment's prompt configuration (--prompt-sections):
// a YAML or JSON object with the fields of Config (identity, persona,
// tool_guidance, sections [{name, order, text}], variables, tool_order).
// Unknown fields are an error, so a typo never silently drops a section.
func LoadConfig(path string) (Config, error) {
	var cfg Config
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("prompt sections: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		return cfg, fmt.Errorf("prompt sections %s: %w", path, err)
	}
	if _, err := New(cfg); err != nil {
		return cfg, fmt.Errorf("prompt sections %s: %w", path, err)
	}
	return cfg, nil
}
