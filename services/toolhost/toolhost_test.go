package toolhost_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
	"github.com/dsh-dev/dsh/services/toolhost"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

func args(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func text(r *toolsv1.ToolExecutionResult) string { return toolsdk.ResultText(r.GetContent()) }

func TestListTools(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	resp, err := h.Client.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]*toolsv1.ToolDescriptor{}
	for _, d := range resp.GetTools() {
		names = append(names, d.GetSchema().GetName())
		byName[d.GetSchema().GetName()] = d
		if !json.Valid([]byte(d.GetSchema().GetParameters())) || !d.GetValidatesArguments() || d.GetTimeoutMs() <= 0 {
			t.Errorf("%s descriptor: %v", d.GetSchema().GetName(), d)
		}
	}
	want := []string{"bash", "task_output", "task_list", "task_kill", "read", "write", "edit", "glob", "grep", "todo_write", "skill"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	if c := byName["read"].GetConcurrency(); c != toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS {
		t.Errorf("read concurrency %v", c)
	}
	if c := byName["edit"].GetConcurrency(); c != toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_UNSPECIFIED {
		t.Errorf("edit concurrency %v", c)
	}
	for _, p := range []string{`"file_path"`, `"old_string"`, `"new_string"`, `"replace_all"`} {
		if !strings.Contains(byName["edit"].GetSchema().GetParameters(), p) {
			t.Errorf("edit schema lacks %s", p)
		}
	}
}

func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	hr, err := healthpb.NewHealthClient(h.Conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: toolsdk.ServiceName})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, %v", hr, err)
	}
	st, err := rpb.NewServerReflectionClient(h.Conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var svcs []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		svcs = append(svcs, s.GetName())
	}
	if !slices.Contains(svcs, "dsh.tools.v1.ToolHost") {
		t.Errorf("reflection lists %v", svcs)
	}
}

func TestFileRoundTripOverGRPC(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	ctx := t.Context()
	_, r, err := h.Execute(ctx, "s", "write", args(map[string]string{"file_path": "dir/a.txt", "content": "alpha\r\nbeta\r\n"}))
	if err != nil || r.GetIsError() {
		t.Fatalf("write: %v %s", err, text(r))
	}
	if _, r, _ = h.Execute(ctx, "s", "edit", args(map[string]string{"file_path": "dir/a.txt", "old_string": "beta", "new_string": "gamma"})); r.GetIsError() {
		t.Fatalf("edit after own write: %s", text(r))
	}
	if _, r, _ = h.Execute(ctx, "other", "edit", args(map[string]string{"file_path": "dir/a.txt", "old_string": "gamma", "new_string": "x"})); r.GetError().GetCode() != "FS_NOT_OBSERVED" {
		t.Errorf("unobserved edit: %s", text(r))
	}
	_, r, _ = h.Execute(ctx, "s", "read", args(map[string]any{"file_path": "dir/a.txt"}))
	if !strings.Contains(text(r), "1: alpha\n2: gamma\n") {
		t.Errorf("read: %s", text(r))
	}
	b, _ := os.ReadFile(filepath.Join(h.Workspace, "dir/a.txt"))
	if string(b) != "alpha\r\ngamma\r\n" {
		t.Errorf("file %q", b)
	}
	os.Symlink("/etc", filepath.Join(h.Workspace, "etc"))
	if _, r, _ = h.Execute(ctx, "s", "read", args(map[string]any{"file_path": "etc/passwd"})); r.GetError().GetCode() != "FS_SANDBOX_DENIED" {
		t.Errorf("symlink escape: %s", text(r))
	}
	if _, r, _ = h.Execute(ctx, "s", "grep", args(map[string]any{"pattern": "gam+a"})); !strings.Contains(text(r), "Line 2: gamma") {
		t.Errorf("grep: %s", text(r))
	}
	if _, r, _ = h.Execute(ctx, "s", "glob", args(map[string]any{"pattern": "**/*.txt"})); text(r) != filepath.Join(h.Workspace, "dir/a.txt") {
		t.Errorf("glob: %s", text(r))
	}
}

func TestBashStreamsThenResult(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	outs, r, err := h.Execute(t.Context(), "s", "bash", args(map[string]any{"command": "echo one; sleep 0.1; echo two >&2; exit 4", "description": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range outs {
		got = append(got, o.GetStream()+":"+o.GetText())
	}
	if diff := cmp.Diff([]string{"stdout:one\n", "stderr:two\n"}, got); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	if text(r) != "one\n[stderr]\ntwo\n[exit code: 4]" || r.GetIsError() {
		t.Errorf("result %q", text(r))
	}
	if ec := r.GetView().GetTerminal().ExitCode; ec == nil || *ec != 4 {
		t.Errorf("terminal view %v", r.GetView())
	}
}

func TestCancelRunningBashKillsProcessGroup(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	marker := fmt.Sprintf("dsh-cancel-test-%d", time.Now().UnixNano())
	ctx, cancel := context.WithCancel(t.Context())
	st, err := h.Client.Execute(ctx, &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{
		CallId: "c", Name: "bash", Context: h.Context("s"),
		Arguments: args(map[string]any{"command": "(exec -a " + marker + " sleep 300) & echo started; wait", "description": "x"}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv() // the first output proves the command runs
	if err != nil || m.GetOutput().GetText() != "started\n" {
		t.Fatalf("first message %v, %v", m, err)
	}
	cancel()
	if _, err := st.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("after cancel: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pids := proctest.Living(marker); len(pids) > 0; pids = proctest.Living(marker) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %v survived the cancelled call", pids)
		}
		time.Sleep(20 * time.Millisecond) // polling other processes
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t, toolhosttest.WithConfig(func(c *toolhost.Config) { c.MaxArgumentBytes = 1024 }))
	outside := t.TempDir()
	// A workspace root inside the host's workspace by name that a symlink
	// leads outside of.
	link := filepath.Join(h.Workspace, "escape")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	// A workspace root that is a file.
	file := filepath.Join(h.Workspace, "notes.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Two sessions' workspace roots side by side, and a link from the
	// first to the second: a cwd in the second (or through the link) is
	// outside the first's root though inside the host's workspace.
	rootA, rootB := filepath.Join(h.Workspace, "a"), filepath.Join(h.Workspace, "b")
	for _, d := range []string{rootA, rootB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	toB := filepath.Join(rootA, "to-b")
	if err := os.Symlink(rootB, toB); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ex   *toolsv1.ToolExecution
		msg  string
	}{
		{"cwd outside the call's workspace root", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: rootB, WorkspaceRoot: rootA}}, rootB + " is outside"},
		{"cwd leaving the call's workspace root through a symlink", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: toB, WorkspaceRoot: rootA}}, "resolves to " + rootB},
		{"workspace root that is a file", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: file, WorkspaceRoot: file}}, file + " is not a directory"},
		{"missing cwd", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{SessionId: "s"}}, "cwd is required"},
		{"relative workspace root", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: "/", WorkspaceRoot: "ws"}}, "must be an absolute path"},
		{"workspace root outside the host's", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: "/", WorkspaceRoot: outside}}, "outside this host's workspace"},
		{"workspace root escaping through a symlink", &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: link, WorkspaceRoot: link}}, "resolves to " + outside},
		{"oversized arguments", &toolsv1.ToolExecution{Name: "write", Arguments: args(map[string]string{"file_path": "x", "content": strings.Repeat("z", 2000)}), Context: h.Context("s")}, "over this host's limit of 1024 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st, err := h.Client.Execute(t.Context(), &toolsv1.ExecuteRequest{Execution: tt.ex})
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Errorf("err = %v, want InvalidArgument %q", err, tt.msg)
			}
			// PrepareExecute refuses the same execution the same way, even
			// when the prepared one had an accepted context.
			prepared := &toolsv1.ToolExecution{Name: "read", Arguments: `{}`, Context: h.Context("s")}
			got, err := toolhostconformance.Exchange(t.Context(), h.Client,
				toolhostconformance.Prepare(prepared), toolhostconformance.Execute(tt.ex))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) || len(got) != 1 {
				t.Errorf("PrepareExecute: %v after %v, want InvalidArgument %q after prepared only", err, got, tt.msg)
			}
		})
	}
	// Schema violations are results, listing every violation.
	_, r, err := h.Execute(t.Context(), "s", "edit", `{"file_path":1,"replace_all":"yes"}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `Error: invalid arguments: "file_path" must be a string; missing required property "old_string"; missing required property "new_string"; "replace_all" must be a boolean`
	if text(r) != want || r.GetError().GetCode() != "INVALID_ARGS" {
		t.Errorf("got %q", text(r))
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, root := range []string{"", "relative/dir", filepath.Join(t.TempDir(), "missing")} {
		if _, err := toolhost.New(toolhost.Config{WorkspaceRoot: root}, nil); err == nil {
			t.Errorf("New accepted workspace root %q", root)
		}
	}
}

func TestCloseKillsBackgroundTasks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	svc, err := toolhost.New(toolhost.Config{WorkspaceRoot: dir, KillGrace: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A confined call's $$ is a pid of its own namespace: find the task by
	// a marker in its command line instead.
	marker := fmt.Sprintf("dsh-close-test-%d", time.Now().UnixNano())
	r := svc.Host().Run(t.Context(), &toolsv1.ToolExecution{Name: "bash", Context: &toolsv1.ToolContext{SessionId: "s", Cwd: dir},
		Arguments: args(map[string]any{"command": "exec -a " + marker + " sleep 300", "description": "x", "run_in_background": true})}, nil)
	if text(r) != "started background task bash-1" {
		t.Fatal(text(r))
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(proctest.Living(marker)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling another process
	}
	if len(proctest.Living(marker)) == 0 {
		t.Fatal("task not running")
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	if pids := proctest.Living(marker); len(pids) > 0 {
		t.Errorf("task %v survived Close", pids)
	}
}

func TestBuiltinHostConforms(t *testing.T) {
	h := toolhosttest.Start(t)
	toolhostconformance.Run(t, h.Client, h.Workspace)
}

func TestPrepareCallsViews(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	resp, err := h.Client.PrepareCalls(t.Context(), &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{
		{CallId: "1", Name: "bash", Arguments: `{"command":"go test ./...","description":"Run the tests","workdir":"sub"}`},
		{CallId: "2", Name: "read", Arguments: `{"file_path":"a.go","offset":40}`},
		{CallId: "3", Name: "edit", Arguments: `{"file_path":"a.go","old_string":"x","new_string":"y"}`},
		{CallId: "4", Name: "grep", Arguments: `{"pattern":"TODO","path":"pkg"}`},
		{CallId: "5", Name: "read", Arguments: `{"file_path":7}`},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.GetCalls()
	if len(c) != 5 {
		t.Fatalf("%d calls", len(c))
	}
	par, exc := toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL, toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE
	if term := c[0].GetView().GetTerminal(); c[0].GetMode() != exc || term.GetTitle() != "go test ./..." || term.GetDescription() != "Run the tests" || term.GetCwd() != "sub" {
		t.Errorf("bash: %v", c[0])
	}
	if g := c[1].GetView().GetGeneric(); c[1].GetMode() != par || g.GetKind() != toolsv1.ToolCallKind_TOOL_CALL_KIND_READ || g.GetLocations()[0].GetPath() != "a.go" || g.GetLocations()[0].GetLine() != 40 {
		t.Errorf("read: %v", c[1])
	}
	if d := c[2].GetView().GetDiff(); c[2].GetMode() != exc || d.GetDiffs()[0].GetOldText() != "x" || d.GetDiffs()[0].GetNewText() != "y" {
		t.Errorf("edit: %v", c[2])
	}
	if g := c[3].GetView().GetGeneric(); c[3].GetMode() != par || g.GetKind() != toolsv1.ToolCallKind_TOOL_CALL_KIND_SEARCH || g.GetLocations()[0].GetPath() != "pkg" {
		t.Errorf("grep: %v", c[3])
	}
	if c[4].GetView() != nil {
		t.Errorf("an old argument shape must fall back to the generic card: %v", c[4])
	}
}
