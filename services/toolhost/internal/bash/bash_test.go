package bash_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/bash"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox"
	"github.com/dsh-dev/dsh/services/toolhost/internal/spill"
)

type env struct {
	t     *testing.T
	dir   string
	host  *toolsdk.Host
	tasks *bash.Tasks
}

func newEnv(t *testing.T, environ ...string) *env {
	t.Helper()
	dir := t.TempDir()
	sp, err := spill.New(filepath.Join(t.TempDir(), "spill"))
	if err != nil {
		t.Fatal(err)
	}
	x := &bash.Executor{Spill: sp, Env: sandbox.Environ(append(environ, "PATH="+os.Getenv("PATH")), []string{"PASSED_THROUGH"}), Grace: 300 * time.Millisecond}
	tasks := bash.NewTasks(nil)
	t.Cleanup(tasks.Close)
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, bash.New(x, tasks).Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, dir: dir, host: h, tasks: tasks}
}

func (e *env) run(ctx context.Context, session, tool string, args any, out func(string, string)) *toolsv1.ToolExecutionResult {
	e.t.Helper()
	b, _ := json.Marshal(args)
	return e.host.Run(ctx, &toolsv1.ToolExecution{CallId: "call-1", Name: tool, Arguments: string(b),
		Context: &toolsv1.ToolContext{SessionId: session, Cwd: e.dir}}, out)
}

func (e *env) bash(args bash.Args) *toolsv1.ToolExecutionResult {
	e.t.Helper()
	return e.run(e.t.Context(), "s", "bash", args, nil)
}

func text(r *toolsv1.ToolExecutionResult) string { return toolsdk.ResultText(r.GetContent()) }

// gone reports whether pid no longer runs (absent or a zombie).
func gone(pid int) bool {
	f, err := proctest.StatFields(pid)
	return err != nil || f[0] == "Z"
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still running", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBashResultText(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	os.Mkdir(filepath.Join(e.dir, "sub"), 0o755)
	tests := []struct {
		name string
		args bash.Args
		want string
	}{
		{"stdout", bash.Args{Command: "echo hello"}, "hello\n[exit code: 0]"},
		{"stderr and non-zero exit", bash.Args{Command: "echo out; echo err >&2; exit 3"}, "out\n[stderr]\nerr\n[exit code: 3]"},
		{"no output", bash.Args{Command: "true"}, "(no output)\n[exit code: 0]"},
		{"relative workdir", bash.Args{Command: "basename $PWD", Workdir: "sub"}, "sub\n[exit code: 0]"},
		{"stdin is empty", bash.Args{Command: "cat; echo done"}, "done\n[exit code: 0]"},
		{"fresh shell, no state", bash.Args{Command: "echo ${FOO:-unset}"}, "unset\n[exit code: 0]"},
		{"non-UTF-8 output repaired", bash.Args{Command: `printf 'caf\xe9\n'`}, "caf\uFFFD\n[exit code: 0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.args.Description = "test"
			r := e.bash(tt.args)
			if r.GetIsError() {
				t.Fatalf("is_error: %s", text(r))
			}
			if diff := cmp.Diff(tt.want, text(r)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if v := r.GetView().GetTerminal(); v.GetOutput() != tt.want {
				t.Errorf("terminal view output %q", v.GetOutput())
			}
		})
	}
}

func TestBashSpawnFailureIsError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.bash(bash.Args{Command: "true", Description: "x", Workdir: "/nonexistent/dir"})
	if !r.GetIsError() || r.GetError().GetCode() != "BASH_SPAWN_FAILED" {
		t.Errorf("got %v: %s", r.GetError(), text(r))
	}
}

// TestBashEnvAllowList: the shell sees the allow-list and the deployment's
// pass-throughs, never the rest of the host environment.
func TestBashEnvAllowList(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "MY_API_KEY=k", "GITHUB_TOKEN=t", "AWS_SECRET_ACCESS_KEY=s", "DB_PASSWORD=p", "DSH_AMBIENT=1", "PLAIN=invisible", "TERM=xterm", "PASSED_THROUGH=visible")
	r := e.bash(bash.Args{Command: "env | sort", Description: "x"})
	got := text(r)
	for _, bad := range []string{"MY_API_KEY", "GITHUB_TOKEN", "AWS_SECRET", "DB_PASSWORD", "DSH_AMBIENT", "TERM=xterm", "PLAIN"} {
		if strings.Contains(got, bad) {
			t.Errorf("%s leaked into the shell:\n%s", bad, got)
		}
	}
	for _, want := range []string{"PASSED_THROUGH=visible", "DSH_SHELL=1", "DSH_SESSION_ID=s", "NO_COLOR=1", "TERM=dumb", "PAGER=cat"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %s:\n%s", want, got)
		}
	}
}

func TestBashTimeoutKillsGrandchildren(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pidfile := filepath.Join(e.dir, "pid")
	// The grandchild ignores SIGTERM, so only the SIGKILL stage can end it.
	cmd := `bash -c 'trap "" TERM; exec sleep 300' & echo $! > ` + pidfile + `; echo before; wait`
	start := time.Now()
	r := e.bash(bash.Args{Command: cmd, Description: "x", TimeoutMs: 500})
	if r.GetIsError() {
		t.Fatalf("timeout is not an error result: %s", text(r))
	}
	want := "before\n[timed out after 500ms]\n[killed by signal: SIGTERM]"
	if diff := cmp.Diff(want, text(r)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("timeout took %v", el)
	}
	waitGone(t, readPid(t, pidfile))
}

func TestBashSpillHoldsFullOutput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.bash(bash.Args{Command: "seq 1 100000", Description: "x"})
	got := text(r)
	i := strings.Index(got, "[output truncated; full output: ")
	if i < 0 {
		t.Fatalf("no truncation marker in %q", got[max(0, len(got)-300):])
	}
	path := strings.TrimSuffix(strings.SplitN(got[i+len("[output truncated; full output: "):], "]", 2)[0], "]")
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for n := 1; n <= 100000; n++ {
		want.WriteString(strconv.Itoa(n) + "\n")
	}
	if string(full) != want.String() {
		t.Errorf("spill file has %d bytes, want %d", len(full), want.Len())
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("spill mode %v", fi.Mode().Perm())
	}
	if !strings.Contains(got, "99999\n100000\n[output truncated") || len(got) > bash.DefaultMaxOutput+500 {
		t.Errorf("inline tail wrong: %d bytes", len(got))
	}
}

func TestBashStreamsOutputWhileRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	var chunks []string
	first := make(chan struct{}, 1)
	marker := filepath.Join(e.dir, "go-on")
	go func() {
		<-first
		os.WriteFile(marker, nil, 0o644)
	}()
	r := e.run(t.Context(), "s", "bash", bash.Args{Command: "echo a; while [ ! -e " + marker + " ]; do sleep 0.01; done; echo b >&2", Description: "x"}, func(s, tx string) {
		mu.Lock()
		chunks = append(chunks, s+":"+tx)
		mu.Unlock()
		select {
		case first <- struct{}{}:
		default:
		}
	})
	// The command can only finish after its first chunk was streamed.
	if diff := cmp.Diff([]string{"stdout:a\n", "stderr:b\n"}, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if text(r) != "a\n[stderr]\nb\n[exit code: 0]" {
		t.Errorf("result %q", text(r))
	}
}

func TestBashCancelKillsGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pidfile := filepath.Join(e.dir, "pid")
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		readPid(t, pidfile)
		cancel()
	}()
	r := e.run(ctx, "s", "bash", bash.Args{Command: "sleep 300 & echo $! > " + pidfile + "; wait", Description: "x"}, nil)
	if r.GetError().GetCode() != "ABORTED" {
		t.Errorf("result %v %s", r.GetError(), text(r))
	}
	waitGone(t, readPid(t, pidfile))
}

func TestBackgroundTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pidfile := filepath.Join(e.dir, "pid")
	r := e.bash(bash.Args{Command: "echo $$ > " + pidfile + "; echo started; sleep 300", Description: "serve", RunInBackground: true})
	if text(r) != "started background task bash-1" {
		t.Fatalf("start: %s", text(r))
	}
	pid := readPid(t, pidfile)
	if gone(pid) {
		t.Fatal("background task did not survive its call")
	}
	out := e.run(t.Context(), "s", "task_output", bash.TaskOutputArgs{TaskID: "bash-1", Wait: true, TimeoutMs: 100}, nil)
	if text(out) != "started\n[status: running]" {
		t.Errorf("task_output: %q", text(out))
	}
	// Reads consume: nothing new now.
	out = e.run(t.Context(), "s", "task_output", bash.TaskOutputArgs{TaskID: "bash-1"}, nil)
	if text(out) != "(no new output)\n[status: running]" {
		t.Errorf("second task_output: %q", text(out))
	}
	if r := e.run(t.Context(), "other", "task_output", bash.TaskOutputArgs{TaskID: "bash-1"}, nil); r.GetError().GetCode() != "TASK_NOT_FOUND" {
		t.Errorf("another session read the task: %s", text(r))
	}
	if l := e.run(t.Context(), "s", "task_list", struct{}{}, nil); text(l) != "bash-1\tbash\trunning\tserve" {
		t.Errorf("task_list: %q", text(l))
	}
	if k := e.run(t.Context(), "s", "task_kill", bash.TaskKillArgs{TaskID: "bash-1"}, nil); text(k) != "Kill requested for task bash-1." {
		t.Errorf("task_kill: %q", text(k))
	}
	out = e.run(t.Context(), "s", "task_output", bash.TaskOutputArgs{TaskID: "bash-1", Wait: true, TimeoutMs: 10000}, nil)
	if text(out) != "(no new output)\n[status: killed (signal SIGTERM)]" {
		t.Errorf("after kill: %q", text(out))
	}
	waitGone(t, pid)
	if k := e.run(t.Context(), "s", "task_kill", bash.TaskKillArgs{TaskID: "bash-1"}, nil); !strings.Contains(text(k), "already finished") {
		t.Errorf("second kill: %q", text(k))
	}
}

// TestBashFailsClosedWithoutASandbox: when no launcher can confine, a
// confined call is a SANDBOX_UNAVAILABLE error and nothing runs; only
// danger-full-access would be allowed to proceed.
func TestBashFailsClosedWithoutASandbox(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sb, err := sandbox.New(sandbox.Config{HostRoot: dir, Exe: filepath.Join(dir, "no-launcher")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if sb.Support().Unavailable == nil {
		t.Fatal("a missing launcher was reported usable")
	}
	x := &bash.Executor{Sandbox: sb, Grace: 300 * time.Millisecond}
	tasks := bash.NewTasks(nil)
	t.Cleanup(tasks.Close)
	sh := bash.New(x, tasks)
	sh.Resolve = func(*toolsdk.Call) (sandbox.Effective, error) {
		return sandbox.Effective{Policy: sandbox.Policy{Mode: sandbox.WorkspaceWrite, Network: true}, Root: dir}, nil
	}
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, sh.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "ran")
	for _, bg := range []bool{false, true} {
		b, _ := json.Marshal(bash.Args{Command: "touch " + marker, Description: "x", RunInBackground: bg})
		r := h.Run(t.Context(), &toolsv1.ToolExecution{CallId: "c", Name: "bash", Arguments: string(b), Context: &toolsv1.ToolContext{SessionId: "s", Cwd: dir}}, nil)
		if r.GetError().GetCode() != "SANDBOX_UNAVAILABLE" || !r.GetIsError() {
			t.Errorf("background=%v: %s", bg, text(r))
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran unconfined")
	}
}
