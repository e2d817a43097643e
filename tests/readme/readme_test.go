// Package readme runs the README's shell commands as a newcomer would: the
// build line, `dsh dev -p` offline with the scripted provider and the
// session commands after it, the three services apart on their documented
// ports, and the grpcurl calls against them. The services use fixed ports,
// so `make test` runs this package alone (make test-readme), after the
// parallel suite; `go test ./...` skips it unless DSH_README_TEST=1.
package readme

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsh-dev/dsh/internal/proctest"
)

// blocks returns the README's unlabelled fenced blocks as logical lines
// (backslash continuations joined, trailing "  # comment" and comment-only
// lines dropped).
func blocks(t *testing.T, readme string) [][]string {
	t.Helper()
	var out [][]string
	parts := strings.Split(readme, "```")
	for i := 1; i < len(parts); i += 2 {
		body, ok := strings.CutPrefix(parts[i], "\n")
		if !ok {
			continue // a labelled block (```json ...): not shell
		}
		var lines []string
		cur := ""
		for _, l := range strings.Split(body, "\n") {
			if j := regexp.MustCompile(`\s{2,}# `).FindStringIndex(l); j != nil {
				l = l[:j[0]]
			}
			l = strings.TrimRight(l, " ")
			if strings.HasPrefix(strings.TrimSpace(l), "#") || strings.TrimSpace(l) == "" && cur == "" {
				continue
			}
			if c, ok := strings.CutSuffix(l, "\\"); ok {
				cur += c
				continue
			}
			lines = append(lines, strings.TrimSpace(cur+l))
			cur = ""
		}
		out = append(out, lines)
	}
	return out
}

// find returns the block whose first line starts with prefix.
func find(t *testing.T, bs [][]string, prefix string) []string {
	t.Helper()
	for _, b := range bs {
		if len(b) > 0 && strings.HasPrefix(b[0], prefix) {
			return b
		}
	}
	t.Fatalf("the README has no block starting with %q", prefix)
	return nil
}

// script is a bash script of lines run in dir with bin/ meaning binDir.
func script(lines []string, binDir string) string {
	var b strings.Builder
	b.WriteString("set -euo pipefail\nshopt -s expand_aliases\n")
	for _, l := range lines {
		l = strings.ReplaceAll(l, "bin/", binDir+"/")
		b.WriteString(l + "\n")
	}
	return b.String()
}

func run(t *testing.T, dir, sh string, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", sh)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v running:\n%s\noutput:\n%s", err, sh, out.String())
	}
	return out.String()
}

// cleanEnv drops provider keys and DSH_* so the scripted provider answers.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasSuffix(k, "_API_KEY") || k == "OPENAI_BASE_URL" || strings.HasPrefix(k, "DSH_") || strings.HasPrefix(k, "NATS_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func TestREADMECommands(t *testing.T) {
	if os.Getenv("DSH_README_TEST") == "" {
		t.Skip("uses the README's fixed ports: run with DSH_README_TEST=1 (make test-readme)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bs := blocks(t, string(readme))
	bin := t.TempDir()
	env := cleanEnv()

	// The services block's build line builds every binary.
	services := find(t, bs, "go build -o bin/ ./cmd/... ./services/.../cmd/...")
	run(t, root, script(services[:1], bin), env)

	// The tour: dsh dev -p offline, piped input, the session commands.
	tour := find(t, bs, "go build -o bin/ ./cmd/dsh")
	var tourLines []string
	for _, l := range tour[1:] {
		switch {
		case strings.HasPrefix(l, "bin/dsh chat"), strings.HasPrefix(l, "bin/dsh events tail"), strings.HasPrefix(l, "bin/dsh tools list"):
			continue // need a running stack: the services part below covers them
		}
		tourLines = append(tourLines, l)
	}
	work := t.TempDir()
	out := run(t, work, script(tourLines, bin), env)
	for _, want := range []string{"scripted demo provider", "id:       ", "dsh (devel)", "dsh "} {
		if !strings.Contains(out, want) {
			t.Errorf("the tour's output lacks %q:\n%s", want, out)
		}
	}

	// The services apart on their documented ports, then the grpcurl calls
	// from the repository root (the grpcurl alias needs tools/go.mod).
	srv := exec.Command("bash", "-c", script(services[1:], bin)+"wait\n")
	srv.Dir, srv.Env = work, env
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-srv.Process.Pid, syscall.SIGTERM)
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("services:\n%s", srvOut.String())
		}
	})
	conn, err := grpc.NewClient("127.0.0.1:7700", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	proctest.WaitServing(wctx, t, conn, "")

	calls := find(t, bs, "alias grpcurl=")
	out = run(t, root, script(calls, bin), env)
	for _, want := range []string{`"status": "SERVING"`, `"status": "AGENT_STATUS_RUNNING"`, `"turnStart"`, `"hello"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the grpcurl calls' output lacks %s:\n%s", want, out)
		}
	}
}
