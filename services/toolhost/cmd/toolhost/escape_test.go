package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// canary is a provider-key-shaped secret in the toolhost's environment and
// in the test's own (the toolhost's parent): no tool may ever print it.
const canary = "sk-canary-4f1e2d3c-never-print-me"

// escapeHost is the real toolhost binary serving two sessions' workspaces
// under one --workspace, with small limits so the limit attempts end fast.
type escapeHost struct {
	c        toolsv1.ToolHostClient
	root     string // --workspace
	outside  string // a directory outside it
	port     int    // a loopback listener that counts connections
	accepted *atomic.Int64
	exited   chan error
	// stop sends the binary SIGTERM and waits until it exited (once).
	stop func() error
}

func startEscapeHost(t *testing.T) *escapeHost {
	t.Helper()
	bin := proctest.Build(t, ".", "toolhost")
	// The small launcher lies next to the binary, as make build and the
	// Dockerfile install it, so the suite attacks the deployed launcher
	// (the sandbox package's own tests cover the self-exec fallback).
	launcherBin := filepath.Join(filepath.Dir(bin), "dsh-sandbox-launcher")
	// With cgo, as make build: the C first stage serves every call
	// (without a C compiler, the Go launcher, as such a build would have).
	cgo := proctest.CgoUsable()
	if !cgo {
		t.Logf("no C compiler: the escape suite attacks the Go launcher, not the C first stage")
	}
	if err := proctest.BuildLauncher(launcherBin, cgo); err != nil {
		t.Fatal(err)
	}
	h := &escapeHost{root: t.TempDir(), outside: t.TempDir(), accepted: new(atomic.Int64), exited: make(chan error, 1)}
	for _, s := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(h.root, s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(h.root, "b", "secret.txt"), []byte("session-b-secret\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(h.outside, "victim.txt"), []byte("untouched\n"), 0o644))

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	h.port = lis.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			c.Close()
		}
	}()

	t.Setenv("DSH_TEST_PARENT_KEY", canary) // the parent's environ holds it too
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin, "--listen", addr, "--workspace", h.root,
		"--limit-cpu", "1", "--limit-memory", "1073741824", "--limit-procs", "64", "--limit-file-size", "8388608")
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY="+canary, "DEEPSEEK_API_KEY="+canary, "MY_SERVICE_PASSWORD="+canary)
	var stderr proctest.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	go func() { h.exited <- cmd.Wait() }()
	h.stop = sync.OnceValue(func() error {
		cmd.Process.Signal(syscall.SIGTERM)
		return <-h.exited
	})
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("toolhost stderr:\n%s", stderr.String())
		}
	})
	conn, err := grpcserver.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	proctest.WaitServing(ctx, t, conn, "")
	if log := stderr.String(); !strings.Contains(log, "launcher="+launcherBin) {
		t.Fatalf("the toolhost did not pick the launcher next to it (%s):\n%s", launcherBin, log)
	}
	h.c = toolsv1.NewToolHostClient(conn)
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type callResult struct {
	text    string
	code    string
	res     *toolsv1.ToolExecutionResult
	outputs string
}

// call runs a tool as session s (root <root>/s) under mode and network.
func (h *escapeHost) call(t *testing.T, s, mode string, netOff bool, tool string, args map[string]any) callResult {
	t.Helper()
	b, _ := json.Marshal(args)
	m := map[string]toolsv1.SandboxMode{
		"read-only": toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY, "workspace-write": toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE,
		"danger-full-access": toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS,
	}[mode]
	n := toolsv1.NetworkAccess_NETWORK_ACCESS_ON
	if netOff {
		n = toolsv1.NetworkAccess_NETWORK_ACCESS_OFF
	}
	root := filepath.Join(h.root, s)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	st, err := h.c.Execute(ctx, &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{
		CallId: "c", Name: tool, Arguments: string(b),
		Context: &toolsv1.ToolContext{SessionId: s, Cwd: root, WorkspaceRoot: root, Sandbox: &toolsv1.SandboxPolicy{Mode: m, Network: n}},
	}})
	must(t, err)
	var out strings.Builder
	for {
		msg, err := st.Recv()
		if err != nil {
			t.Fatalf("%s %v: %v", tool, args, err)
		}
		if o := msg.GetOutput(); o != nil {
			out.WriteString(o.GetText())
		}
		if r := msg.GetResult(); r != nil {
			return callResult{text: toolsdk.ResultText(r.GetContent()), code: r.GetError().GetCode(), res: r, outputs: out.String()}
		}
	}
}

func (h *escapeHost) bash(t *testing.T, s, mode string, netOff bool, command string) callResult {
	t.Helper()
	return h.call(t, s, mode, netOff, "bash", map[string]any{"command": command, "description": "escape attempt", "timeoutMs": 20000})
}

// TestEscapeSuite attacks every boundary of a confined call through the
// real toolhost binary, in each confined mode: every attempt must fail,
// legitimate work in the workspace must succeed, and the host must keep
// serving.
func TestEscapeSuite(t *testing.T) {
	h := startEscapeHost(t)
	a := filepath.Join(h.root, "a")
	bSecret := filepath.Join(h.root, "b", "secret.txt")
	victim := filepath.Join(h.outside, "victim.txt")

	for _, mode := range []string{"read-only", "workspace-write"} {
		t.Run(mode, func(t *testing.T) {
			writes := []struct{ name, cmd, path string }{
				{"absolute", "echo pwned > " + h.outside + "/abs.txt", filepath.Join(h.outside, "abs.txt")},
				{"dotdot", "echo pwned > ../dotdot.txt", filepath.Join(h.root, "dotdot.txt")},
				{"dotdot-other-session", "echo pwned > ../b/planted.txt", filepath.Join(h.root, "b", "planted.txt")},
				{"symlink", "ln -sfn " + h.outside + " out; echo pwned > out/sym.txt", filepath.Join(h.outside, "sym.txt")},
				{"hardlink", "ln " + victim + " hl.txt; echo pwned >> hl.txt", ""},
				{"rename-out", "echo mine > mine.txt; mv mine.txt " + h.outside + "/moved.txt", filepath.Join(h.outside, "moved.txt")},
				{"rename-in", "mv " + bSecret + " stolen.txt", filepath.Join(a, "stolen.txt")},
				{"tmp-of-host", "echo pwned > /tmp/dsh-escape-" + mode + ".txt", "/tmp/dsh-escape-" + mode + ".txt"},
			}
			for _, w := range writes {
				r := h.bash(t, "a", mode, false, w.cmd)
				if w.path != "" {
					if _, err := os.Stat(w.path); err == nil {
						os.Remove(w.path)
						t.Errorf("%s: %q created %s\n%s", w.name, w.cmd, w.path, r.text)
					}
				}
				if !strings.Contains(r.text, "[sandbox: file access denied under "+mode+" mode]") {
					t.Errorf("%s: no denial marker:\n%s", w.name, r.text)
				}
			}
			if b, _ := os.ReadFile(victim); string(b) != "untouched\n" {
				t.Errorf("victim outside the workspace changed: %q", b)
			}
			if b, _ := os.ReadFile(bSecret); string(b) != "session-b-secret\n" {
				t.Errorf("session b's file changed or moved: %q", b)
			}

			// Reading another session's workspace.
			for _, cmd := range []string{"cat " + bSecret, "cat ../b/secret.txt", "ls ../b", "grep -r secret " + filepath.Join(h.root, "b"), "cp " + bSecret + " $TMPDIR/x; cat $TMPDIR/x"} {
				if r := h.bash(t, "a", mode, false, cmd); strings.Contains(r.text, "session-b-secret") || strings.Contains(r.text, "secret.txt\n") {
					t.Errorf("%q read session b:\n%s", cmd, r.text)
				}
			}
			for _, c := range []struct {
				tool string
				args map[string]any
			}{
				{"read", map[string]any{"file_path": bSecret}},
				{"read", map[string]any{"file_path": "../b/secret.txt"}},
				{"grep", map[string]any{"pattern": "secret", "path": filepath.Join(h.root, "b")}},
				{"glob", map[string]any{"pattern": "*", "path": "../b"}},
				{"write", map[string]any{"file_path": filepath.Join(h.outside, "fs.txt"), "content": "pwned"}},
			} {
				if r := h.call(t, "a", mode, false, c.tool, c.args); r.code != "FS_SANDBOX_DENIED" || strings.Contains(r.text, "session-b-secret") {
					t.Errorf("%s %v: code %q\n%s", c.tool, c.args, r.code, r.text)
				}
			}

			// Secrets: the environment, every ancestor's and pid 1's environ.
			for _, cmd := range []string{
				"env", "cat /proc/$PPID/environ", "cat /proc/1/environ", "cat /proc/1/cmdline",
				"for f in /proc/[0-9]*/environ; do cat $f; done", "cat /proc/[0-9]*/cmdline",
				"p=$$; while [ \"$p\" -gt 1 ]; do cat /proc/$p/environ; p=$(awk '{print $4}' /proc/$p/stat); done",
			} {
				if r := h.bash(t, "a", mode, false, cmd); strings.Contains(r.text, canary) || strings.Contains(r.outputs, canary) {
					t.Errorf("%q printed the canary", cmd)
				}
			}

			// Network off: a loopback port is unreachable.
			before := h.accepted.Load()
			r := h.bash(t, "a", mode, true, fmt.Sprintf("echo hi > /dev/tcp/127.0.0.1/%d && echo CONNECTED", h.port))
			if strings.Contains(r.text, "CONNECTED") || h.accepted.Load() != before {
				t.Errorf("network off: connected\n%s", r.text)
			}

			// Containment: nothing a call starts outlives it.
			marker := fmt.Sprintf("dsh-escape-%s-%d", mode, time.Now().UnixNano())
			for _, cmd := range []string{
				"setsid bash -c 'exec -a " + marker + " sleep 300' & echo started",
				"nohup bash -c 'exec -a " + marker + " sleep 300' >/dev/null 2>&1 & echo started",
				"( ( exec -a " + marker + " sleep 300 ) & ) ; echo started",
				"setsid -f bash -c 'trap \"\" TERM HUP; exec -a " + marker + " sleep 300'; echo started",
			} {
				r := h.bash(t, "a", mode, false, cmd)
				if !strings.Contains(r.text, "started") {
					t.Errorf("%q did not run:\n%s", cmd, r.text)
				}
				if pids := proctest.Living(marker); len(pids) > 0 {
					t.Errorf("%q left %v running after the call returned", cmd, pids)
					for _, p := range pids {
						syscall.Kill(p, syscall.SIGKILL)
					}
				}
			}
		})
	}

	t.Run("limits", func(t *testing.T) {
		marker := fmt.Sprintf("dsh-bomb-%d", time.Now().UnixNano())
		r := h.call(t, "a", "workspace-write", false, "bash", map[string]any{"description": "fork bomb", "timeoutMs": 4000,
			"command": "for i in $(seq 200); do (exec -a " + marker + " sleep 60) & done; wait"})
		if !strings.Contains(r.text, "[limit: process count of 64 reached]") {
			t.Errorf("fork bomb:\n%s", r.text)
		}
		if pids := proctest.Living(marker); len(pids) > 0 {
			t.Errorf("fork bomb left %d processes", len(pids))
		}
		r = h.bash(t, "a", "workspace-write", false, ":(){ :|:& };:; sleep 1; echo after")
		if r.code != "" {
			t.Errorf("classic bomb: %s", r.text)
		}
		r = h.bash(t, "a", "workspace-write", false, "head -c 100000000 /dev/zero > big.bin")
		if fi, err := os.Stat(filepath.Join(a, "big.bin")); err != nil || fi.Size() > 8388608 || !strings.Contains(r.text, "[limit: file size of 8388608 bytes exceeded]") {
			t.Errorf("big write: %v\n%s", err, r.text)
		}
		os.Remove(filepath.Join(a, "big.bin"))
		r = h.bash(t, "a", "workspace-write", false, "while :; do :; done")
		if !strings.Contains(r.text, "[limit: CPU time of 1s per process exceeded]") {
			t.Errorf("infinite loop:\n%s", r.text)
		}
		if _, err := exec.LookPath("python3"); err == nil {
			r = h.bash(t, "a", "workspace-write", false, "python3 -c 'x = bytearray(4 << 30)'")
			if !strings.Contains(r.text, "[limit: memory of 1073741824 bytes per process reached]") {
				t.Errorf("memory:\n%s", r.text)
			}
		}
	})

	t.Run("legitimate", func(t *testing.T) {
		r := h.bash(t, "a", "workspace-write", false,
			"mkdir -p d && echo ok > d/f && mv d/f d/g && ln -s g d/l && ln d/g d/h && cat d/l && echo t > $TMPDIR/x && mv $TMPDIR/x d/x && cat d/x && ls /usr/bin >/dev/null && echo done")
		if r.text != "ok\nt\ndone\n[exit code: 0]" {
			t.Errorf("workspace work:\n%s", r.text)
		}
		if e := r.res.GetEnforcement(); e != toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_FULL {
			t.Errorf("enforcement %v", e)
		}
		if r := h.bash(t, "a", "read-only", false, "cat d/g && echo x > d/new"); !strings.Contains(r.text, "ok\n") || !strings.Contains(r.text, "[sandbox: file access denied under read-only mode]") {
			t.Errorf("read-only:\n%s", r.text)
		}
		if r := h.call(t, "a", "read-only", false, "write", map[string]any{"file_path": "d/new", "content": "x"}); r.code != "FS_SANDBOX_DENIED" {
			t.Errorf("read-only write tool: %s", r.text)
		}
		if r := h.call(t, "a", "workspace-write", false, "read", map[string]any{"file_path": "d/g"}); r.code != "" {
			t.Errorf("read own file: %s", r.text)
		}
		before := h.accepted.Load()
		if r := h.bash(t, "a", "workspace-write", false, fmt.Sprintf("echo hi > /dev/tcp/127.0.0.1/%d && echo CONNECTED", h.port)); !strings.Contains(r.text, "CONNECTED") {
			t.Errorf("network on:\n%s", r.text)
		}
		deadline := time.Now().Add(5 * time.Second)
		for h.accepted.Load() == before && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // the listener runs on its own goroutine
		}
		if h.accepted.Load() == before {
			t.Error("network on: the listener saw no connection")
		}
		// A flood: the live stream is capped, the spill holds everything and
		// the session can read it back, with bash and with the read tool.
		r = h.bash(t, "a", "workspace-write", false, "head -c 20000000 /dev/zero | tr '\\0' a; echo; echo END")
		if len(r.outputs) > 2<<20 {
			t.Errorf("a 20 MB flood streamed %d bytes of live output", len(r.outputs))
		}
		i := strings.Index(r.text, "[output truncated; full output: ")
		if i < 0 || !strings.Contains(r.text, "[read the full output with the read tool") {
			t.Fatalf("flood result:\n%s", r.text[max(0, len(r.text)-500):])
		}
		spill := strings.SplitN(r.text[i+len("[output truncated; full output: "):], "]", 2)[0]
		if fi, err := os.Stat(spill); err != nil || fi.Size() != 20000005 {
			t.Errorf("spill %s: %v %v", spill, fi, err)
		}
		if rr := h.bash(t, "a", "read-only", false, "tail -c 4 "+spill); !strings.HasPrefix(rr.text, "END") {
			t.Errorf("session cannot read its spill with bash:\n%s", rr.text)
		}
		if rr := h.call(t, "b", "workspace-write", false, "bash", map[string]any{"command": "tail -c 4 " + spill, "description": "x"}); strings.HasPrefix(rr.text, "END") {
			t.Errorf("session b read session a's spill:\n%s", rr.text)
		}
		select {
		case err := <-h.exited:
			t.Fatalf("toolhost exited: %v", err)
		default:
		}
	})
}
