package llmgateway

import (
	"slices"
	"testing"
)

// TestEnvVarsListsWhatConfigFromEnvReads keeps --help's list of variables
// and ConfigFromEnv in step.
func TestEnvVarsListsWhatConfigFromEnvReads(t *testing.T) {
	var read []string
	if _, err := ConfigFromEnv(func(k string) string {
		read = append(read, k)
		return "1s"
	}); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, v := range EnvVars() {
		if v.Doc == "" {
			t.Errorf("%s has no description", v.Name)
		}
		listed = append(listed, v.Name)
	}
	slices.Sort(read)
	slices.Sort(listed)
	if !slices.Equal(slices.Compact(read), listed) {
		t.Fatalf("ConfigFromEnv reads %v; EnvVars lists %v", read, listed)
	}
}
