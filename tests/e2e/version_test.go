package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/services/llmgateway"
)

// TestVersionHelpAndStrayArguments runs every binary as a user would:
// --version (anywhere among the arguments) prints one line naming the binary
// and exits 0; llmgateway --help lists the variables that register provider
// routes and DSH_SCRIPT; a service given a stray argument refuses it rather
// than dropping the flags after it.
func TestVersionHelpAndStrayArguments(t *testing.T) {
	t.Parallel()
	bins := []string{"agent", "llmgateway", "toolhost", "mcpbridge", "dsh"}
	for _, b := range bins {
		for _, args := range [][]string{{"--version"}, {"--listen", "127.0.0.1:1", "--version"}} {
			if b == "dsh" {
				args = append([]string{"sessions", "list"}, args...)
			}
			out, err := exec.Command(filepath.Join(binDir, b), args...).Output()
			if err != nil {
				if b == "dsh" && args[2] == "--listen" {
					continue // dsh sessions has no --listen: not a version case
				}
				t.Fatalf("%s %q: %v", b, args, err)
			}
			if line := string(out); !strings.HasPrefix(line, b+" ") || !strings.Contains(line, " go1.") || strings.Count(line, "\n") != 1 {
				t.Errorf("%s %q printed %q", b, args, line)
			}
		}
	}

	out, err := exec.Command(filepath.Join(binDir, "llmgateway"), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("llmgateway --help: %v\n%s", err, out)
	}
	for _, v := range llmgateway.EnvVars() {
		if !strings.Contains(string(out), v.Name) {
			t.Errorf("llmgateway --help does not list %s:\n%s", v.Name, out)
		}
	}

	for _, b := range []string{"agent", "llmgateway", "toolhost", "mcpbridge"} {
		out, err := exec.Command(filepath.Join(binDir, b), "stray", "--listen", "127.0.0.1:1").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "unexpected argument") || !strings.Contains(string(out), "stray") {
			t.Errorf("%s stray --listen ...: %v\n%s", b, err, out)
		}
	}
}
