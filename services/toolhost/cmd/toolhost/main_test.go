package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// TestBinary runs the real toolhost binary the way an operator would (flags
// from the environment, a workspace, a policy file), inspects it by
// reflection as grpcurl does, runs the file and shell tools, asks the policy
// interceptor, and stops it with SIGTERM.
func TestBinary(t *testing.T) {
	bin := proctest.Build(t, ".", "toolhost")
	ws := t.TempDir()
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin, "--policy", "../../policy/testdata/example.policy")
	cmd.Env = append(os.Environ(), "DSH_LISTEN="+addr, "DSH_WORKSPACE="+ws)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	conn, err := grpcserver.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	proctest.WaitServing(ctx, t, conn, "")

	// Reflection, as grpcurl list / describe use it.
	rs, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}})
	lr, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range lr.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{"dsh.tools.v1.ToolHost", "dsh.tools.v1.ToolInterceptor", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Errorf("reflection lists %v, missing %s", services, want)
		}
	}
	rs.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "dsh.tools.v1.ToolHost"}})
	fr, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, raw := range fr.GetFileDescriptorResponse().GetFileDescriptorProto() {
		var fd descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(raw, &fd); err != nil {
			t.Fatal(err)
		}
		for _, s := range fd.GetService() {
			if s.GetName() == "ToolHost" {
				for _, m := range s.GetMethod() {
					methods = append(methods, m.GetName())
				}
			}
		}
	}
	if strings.Join(methods, ",") != "ListTools,WatchTools,PrepareCalls,Execute,PrepareExecute,GetWorkspaceContext,EndSession" {
		t.Errorf("ToolHost methods by reflection: %v", methods)
	}

	c := toolsv1.NewToolHostClient(conn)
	run := func(tool string, args map[string]any) *toolsv1.ToolExecutionResult {
		t.Helper()
		b, _ := json.Marshal(args)
		st, err := c.Execute(ctx, &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{
			CallId: "c-" + tool, Name: tool, Arguments: string(b), Context: &toolsv1.ToolContext{SessionId: "s", Cwd: ws},
		}})
		if err != nil {
			t.Fatal(err)
		}
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("%s: %v", tool, err)
			}
			if r := m.GetResult(); r != nil {
				if r.GetIsError() {
					t.Fatalf("%s: %s", tool, toolsdk.ResultText(r.GetContent()))
				}
				return r
			}
		}
	}
	run("write", map[string]any{"file_path": "notes.md", "content": "# Notes\nhello\n"})
	run("edit", map[string]any{"file_path": "notes.md", "old_string": "hello", "new_string": "hello, toolhost"})
	if got := toolsdk.ResultText(run("read", map[string]any{"file_path": "notes.md"}).GetContent()); !strings.Contains(got, "2: hello, toolhost") {
		t.Errorf("read: %s", got)
	}
	if got := toolsdk.ResultText(run("glob", map[string]any{"pattern": "*.md"}).GetContent()); got != filepath.Join(ws, "notes.md") {
		t.Errorf("glob: %s", got)
	}
	if got := toolsdk.ResultText(run("grep", map[string]any{"pattern": "toolhost"}).GetContent()); !strings.Contains(got, "Line 2: hello, toolhost") {
		t.Errorf("grep: %s", got)
	}
	if got := toolsdk.ResultText(run("bash", map[string]any{"command": "wc -l < notes.md", "description": "count lines"}).GetContent()); got != "2\n[exit code: 0]" {
		t.Errorf("bash: %q", got)
	}

	ic := toolsv1.NewToolInterceptorClient(conn)
	d, err := ic.PreExecute(ctx, &toolsv1.PreExecuteRequest{Execution: &toolsv1.ToolExecution{Name: "bash", Arguments: `{"command":"rm -rf /","description":"x"}`}})
	if err != nil || d.GetDecision().GetDeny() == nil {
		t.Errorf("policy PreExecute = %v, %v; want deny", d, err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("toolhost exited with %v after SIGTERM", err)
		}
	case <-ctx.Done():
		t.Fatal("toolhost did not stop on SIGTERM")
	}
}

// TestMalformedVariables: a variable that configures the toolhost but does
// not parse stops it before it serves, with one line naming the variable
// and its value, even when the flag it defaults is given; unset, empty and
// well-formed values are taken (those rows stop at the bad --sandbox-mode
// that comes after the variables' check).
func TestMalformedVariables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		wantErr string
	}{
		{"unset", nil, nil, "--sandbox-mode"},
		{"empty", map[string]string{"DSH_MAX_CONNECTION_AGE": "", "DSH_INSECURE": "", "DSH_DEBUG_ALLOW_REMOTE": ""}, nil, "--sandbox-mode"},
		{"well-formed", map[string]string{"DSH_MAX_CONNECTION_AGE": "90", "DSH_INSECURE": "false", "DSH_DEBUG_ALLOW_REMOTE": "yes"}, nil, "--sandbox-mode"},
		{"duration", map[string]string{"DSH_MAX_CONNECTION_AGE": "soon"}, nil, `DSH_MAX_CONNECTION_AGE="soon": not a duration`},
		{"duration under its flag", map[string]string{"DSH_MAX_CONNECTION_AGE": "soon"}, []string{"--max-connection-age", "1m"}, `DSH_MAX_CONNECTION_AGE="soon": not a duration`},
		{"boolean", map[string]string{"DSH_INSECURE": "maybe"}, nil, `DSH_INSECURE="maybe": not a boolean`},
		{"boolean of the debug server", map[string]string{"DSH_DEBUG_ALLOW_REMOTE": "2"}, nil, `DSH_DEBUG_ALLOW_REMOTE="2": not a boolean`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DSH_LISTEN": "127.0.0.1:0", "DSH_WORKSPACE": t.TempDir(), "OTEL_SDK_DISABLED": "true"}
			for k, v := range tc.env {
				env[k] = v
			}
			err := run(append([]string{"--sandbox-mode", "bogus"}, tc.args...), func(k string) string { return env[k] }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("run = %v, want one line with %q", err, tc.wantErr)
			}
		})
	}
}
