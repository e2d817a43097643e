// Package clients_test runs the client examples — a Python and a Node
// program that drive a session, and a Python and a Node consumer of the
// DSH_EVENTS JetStream stream — against the real stack: the llmgateway with
// the scripted provider, the built-in toolhost and the agent, built with
// `go build`, on loopback ports chosen by the OS, with an embedded NATS
// server. The SDKs are installed from their packages, never imported from
// the checkout: a wheel built from sdk/python into a venv (Debian's grpcio
// and protobuf below it), and the `npm pack` tarball of sdk/typescript into
// a directory beside the Node examples.
//
// Each consumer must print exactly the lines the driver printed for the same
// session (seq, event and text, chunk deltas skipped), and the driver must
// have seen the scripted tool's output in the final answer.
package clients_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/proctest"
)

const script = `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Running it.","tool_calls":[{"name":"bash","arguments":{"command":"echo hello-from-bash","description":"greet"}}]},
 {"text":"Done. The tool said: {{last_tool_result}}"}
]}`

var (
	eventLine   = regexp.MustCompile(`^\d+ [a-z_]+(: .*)?$`)
	sessionLine = regexp.MustCompile(`^session (\S+) AGENT_STATUS_IDLE$`)
)

func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the repository")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func TestClientExamples(t *testing.T) {
	root := repoRoot(t)
	for _, tool := range []string{"/usr/bin/python3", "node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run scripts/setup-polyglot.sh (%v)", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	// Build the services and install both SDKs at the same time.
	bin, py, node := t.TempDir(), t.TempDir(), t.TempDir()
	var wg sync.WaitGroup
	errs, took := make([]error, 3), make([]time.Duration, 3)
	began := time.Now()
	for i, step := range []func() error{
		func() error {
			return run(ctx, root, nil, "go", "build", "-o", bin+string(os.PathSeparator),
				"./services/llmgateway/cmd/llmgateway", "./services/toolhost/cmd/toolhost", "./services/agent/cmd/agent")
		},
		func() error { return installPython(ctx, root, py) },
		func() error { return installNode(ctx, root, node) },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			errs[i] = step()
			took[i] = time.Since(t0).Round(time.Millisecond)
		}()
	}
	wg.Wait()
	t.Logf("ready in %v: go build %v, Python wheel and venv %v, npm pack and install %v",
		time.Since(began).Round(time.Millisecond), took[0], took[1], took[2])
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	nats := natstest.Start(t)
	workspace, data := t.TempDir(), t.TempDir()
	gateway, toolhost, agent := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	start(t, filepath.Join(bin, "llmgateway"), []string{"DSH_SCRIPT=" + script}, "--listen", gateway)
	start(t, filepath.Join(bin, "toolhost"), nil, "--listen", toolhost, "--workspace", workspace)
	waitServing(ctx, t, gateway)
	waitServing(ctx, t, toolhost)
	start(t, filepath.Join(bin, "agent"), nil, "--listen", agent, "--gateway", gateway, "--toolhost", "builtin="+toolhost,
		"--data", data, "--nats", nats.URL(), "--approval-rule", "*=allow", "--no-titles")
	waitServing(ctx, t, agent)

	env := []string{"DSH_AGENT=" + agent, "NATS_URL=" + nats.URL(), "DSH_PROVIDER=scripted", "DSH_MODEL=scripted"}
	python := filepath.Join(py, "venv", "bin", "python")
	drivers := map[string][]string{
		"python": {python, filepath.Join(py, "drive_session.py"), "run the greeting"},
		"node":   {"node", filepath.Join(node, "drive-session.mjs"), "run the greeting"},
	}
	consumers := map[string][]string{
		"python": {python, filepath.Join(py, "consume_events.py")},
		"node":   {"node", filepath.Join(node, "consume-events.mjs")},
	}
	for _, lang := range []string{"python", "node"} {
		t.Run(lang+" driver", func(t *testing.T) {
			out, err := output(ctx, workspace, env, drivers[lang]...)
			if err != nil {
				t.Fatalf("driver: %v\n%s", err, out)
			}
			t.Logf("%s driver:\n%s", lang, out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			m := sessionLine.FindStringSubmatch(lines[len(lines)-1])
			if m == nil {
				t.Fatalf("driver did not end with \"session <id> AGENT_STATUS_IDLE\":\n%s", out)
			}
			events := eventLines(lines)
			if !slices.ContainsFunc(events, func(l string) bool {
				return strings.Contains(l, " assistant_message: Done. The tool said: hello-from-bash")
			}) || !slices.ContainsFunc(events, func(l string) bool { return strings.HasSuffix(l, " turn_end") }) {
				t.Fatalf("driver output lacks the final answer with the tool's output or the turn's end:\n%s", out)
			}
			for name, argv := range consumers {
				got, err := output(ctx, workspace, env, append(slices.Clone(argv), m[1])...)
				if err != nil {
					t.Fatalf("%s consumer: %v\n%s", name, err, got)
				}
				if diff := diffLines(events, eventLines(strings.Split(strings.TrimSpace(got), "\n"))); diff != "" {
					t.Errorf("%s consumer of the %s driver's session %s differs from what the driver saw:\n%s", name, lang, m[1], diff)
				}
			}
		})
	}
}

// installPython builds a wheel from a copy of sdk/python (no tests) and
// installs it into a venv that sees Debian's grpcio and protobuf, with no
// package index; the examples are copied beside it.
func installPython(ctx context.Context, root, dir string) error {
	src := filepath.Join(dir, "src")
	if err := copyTree(filepath.Join(root, "sdk", "python"), src, func(rel string) bool {
		return rel == "tests" || strings.HasSuffix(rel, "__pycache__") || rel == "build" || strings.HasSuffix(rel, ".egg-info")
	}); err != nil {
		return err
	}
	// Debian's pip drives the venv (--python): a venv without its own pip
	// is made in a fraction of a second.
	venv := filepath.Join(dir, "venv")
	pip := []string{"/usr/bin/python3", "-m", "pip", "--disable-pip-version-check", "--quiet"}
	for _, argv := range [][]string{
		{"/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip", venv},
		append(slices.Clone(pip), "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", filepath.Join(dir, "dist"), src),
	} {
		if err := run(ctx, dir, nil, argv...); err != nil {
			return err
		}
	}
	wheels, _ := filepath.Glob(filepath.Join(dir, "dist", "dsh_toolhost-*.whl"))
	if len(wheels) != 1 {
		return fmt.Errorf("expected one dsh_toolhost wheel, found %v", wheels)
	}
	// Dependencies are checked, not skipped: Debian's grpcio and protobuf
	// must satisfy the wheel's floors.
	install := append(slices.Clone(pip), "--python", filepath.Join(venv, "bin", "python"), "install", "--no-build-isolation", "--no-index", wheels[0])
	if err := run(ctx, dir, nil, install...); err != nil {
		return err
	}
	if err := os.RemoveAll(src); err != nil { // nothing of the SDK is left outside the venv
		return err
	}
	return copyTree(filepath.Join(root, "examples", "clients", "python"), dir, nil)
}

// installNode packs sdk/typescript from a copy (npm pack's prepack copies
// the protos into the package; the checkout stays untouched) and installs
// the tarball, with the examples' own dependencies, beside the examples.
func installNode(ctx context.Context, root, dir string) error {
	stage := filepath.Join(dir, ".stage")
	skipModules := func(rel string) bool { return rel == "node_modules" || rel == "test" || strings.HasSuffix(rel, ".tgz") }
	if err := copyTree(filepath.Join(root, "sdk", "typescript"), filepath.Join(stage, "sdk", "typescript"), skipModules); err != nil {
		return err
	}
	if err := copyTree(filepath.Join(root, "proto"), filepath.Join(stage, "proto"), nil); err != nil {
		return err
	}
	if err := run(ctx, filepath.Join(stage, "sdk", "typescript"), nil, "npm", "pack", "--loglevel=error", "--pack-destination", stage); err != nil {
		return err
	}
	tgz, _ := filepath.Glob(filepath.Join(stage, "dsh-toolhost-*.tgz"))
	if len(tgz) != 1 {
		return fmt.Errorf("expected one dsh-toolhost tarball, found %v", tgz)
	}
	if err := copyTree(filepath.Join(root, "examples", "clients", "typescript"), dir, nil); err != nil {
		return err
	}
	if err := run(ctx, dir, nil, "npm", "install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", "--no-save", tgz[0]); err != nil {
		return err
	}
	return os.RemoveAll(stage)
}

func copyTree(src, dst string, skip func(rel string) bool) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if skip != nil && rel != "." && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
}

// baseEnv is the environment without provider keys and dsh or NATS
// settings, so the gateway serves only the scripted route.
func baseEnv(extra []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasSuffix(k, "_API_KEY") || k == "OPENAI_BASE_URL" || strings.HasPrefix(k, "DSH_") ||
			strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "OTEL_") || k == "PYTHONPATH" || k == "NODE_PATH" {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func run(ctx context.Context, dir string, env []string, argv ...string) error {
	out, err := output(ctx, dir, env, argv...)
	if err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return nil
}

func output(ctx context.Context, dir string, env []string, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, baseEnv(env)
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func eventLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if eventLine.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

func diffLines(want, got []string) string {
	if slices.Equal(want, got) {
		return ""
	}
	return fmt.Sprintf("want %d lines:\n  %s\ngot %d lines:\n  %s", len(want), strings.Join(want, "\n  "), len(got), strings.Join(got, "\n  "))
}

// start runs a service until the test ends (SIGTERM, then SIGKILL after
// 15 s); its output is logged when the test fails.
func start(t *testing.T, bin string, env []string, args ...string) {
	cmd := exec.Command(bin, args...)
	cmd.Env = baseEnv(env)
	out := &proctest.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", filepath.Base(bin), out.String())
		}
	})
}

// waitServing waits until the service at addr reports SERVING.
func waitServing(ctx context.Context, t *testing.T, addr string) {
	conn, err := grpcserver.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	proctest.WaitServing(ctx, t, conn, "")
}
