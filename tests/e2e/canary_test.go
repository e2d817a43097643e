package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDevProviderKeyCanary runs `dsh dev` with provider keys in its
// environment and a scripted model whose bash call tries every way to
// print them: its own environment, its parent's and pid 1's environ, every
// process's environ. No output may contain the key, in any sandbox mode.
func TestDevProviderKeyCanary(t *testing.T) {
	t.Parallel()
	const canary = "sk-dev-canary-9b8a7c6d-never-print-me"
	const script = `{"models":[{"id":"scripted"}],"steps":[` +
		`{"tool_calls":[{"id":"c1","name":"bash","arguments":{"description":"print secrets","command":` +
		`"echo MARK-RAN; env; cat /proc/$PPID/environ; cat /proc/1/environ; for f in /proc/[0-9]*/environ; do cat $f; done; cat /proc/[0-9]*/cmdline; p=$$; while [ \"$p\" -gt 1 ]; do cat /proc/$p/environ; p=$(awk '{print $4}' /proc/$p/stat); done"}}]},` +
		`{"text":"done"}]}`
	for _, mode := range []string{"workspace-write", "read-only", "danger-full-access"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			args := devArgs(filepath.Join(dir, ".dsh"), "-p", "print the key", "--json", "--provider", "scripted", "--model", "scripted", "--sandbox-mode", mode)
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), args...)
			cmd.Dir = dir
			cmd.Env = cleanEnv("DSH_SCRIPT="+script, "DEEPSEEK_API_KEY="+canary, "ANTHROPIC_API_KEY="+canary, "MY_DEPLOY_TOKEN="+canary)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("dsh dev: %v\nstderr:\n%s", err, stderr.String())
			}
			out := stdout.String()
			if !strings.Contains(out, "MARK-RAN") {
				t.Fatalf("the scripted bash call did not run:\n%s", out)
			}
			if strings.Contains(out, canary) || strings.Contains(stderr.String(), canary) {
				t.Errorf("a tool printed the provider key under %s", mode)
			}
		})
	}
}

// TestDevEnvironHoldsNoKey proves the scrub itself: while `dsh dev` runs
// (gateway, toolhost and agent in one process), its /proc/<pid>/environ,
// read from outside any sandbox, no longer holds the provider key it was
// started with — neither its value nor its name — once the stack has begun
// to start (its log has a line: main scrubs before anything else) or it has
// re-executed itself (the fallback when the block cannot be overwritten).
func TestDevEnvironHoldsNoKey(t *testing.T) {
	t.Parallel()
	const canary = "sk-dev-environ-canary-1a2b3c"
	const script = `{"models":[{"id":"scripted"}],"steps":[{"text":"slow","delay_ms":20000}]}`
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := devArgs(filepath.Join(dir, ".dsh"), "-p", "wait", "--provider", "scripted", "--model", "scripted")
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv("DSH_SCRIPT="+script, "DEEPSEEK_API_KEY="+canary)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	environ := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "environ")
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(environ)
		if err != nil {
			t.Fatal(err)
		}
		logged, _ := os.ReadFile(filepath.Join(dir, ".dsh", "dsh.log"))
		if bytes.Contains(b, []byte("DSH_SECRETS_FD=")) || len(logged) > 0 {
			if bytes.Contains(b, []byte(canary)) || bytes.Contains(b, []byte("DEEPSEEK_API_KEY")) {
				t.Fatalf("dsh dev's environ still holds the provider key once it runs:\n%q", b)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dsh dev never came up; environ:\n%q", b)
		}
		time.Sleep(10 * time.Millisecond) // polling another process
	}
}
