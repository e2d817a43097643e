package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/proctest"
)

// TestAllowlistApproverBinary builds the example, runs it as a process and
// asks it like the agent would; chained commands are denied.
func TestAllowlistApproverBinary(t *testing.T) {
	bin := proctest.Build(t, ".", "allowlist-approver")
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DSH_LISTEN="+addr, "DSH_ALLOW=ls,git")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	conn, err := grpcserver.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	proctest.WaitServing(ctx, t, conn, "")
	c := agentv1.NewApproverClient(conn)
	tests := []struct {
		tool, args string
		want       agentv1.ApproverVerdict
	}{
		{"bash", `{"command":"git status"}`, agentv1.ApproverVerdict_APPROVER_VERDICT_ALLOW},
		{"bash", `{"command":"ls -la"}`, agentv1.ApproverVerdict_APPROVER_VERDICT_ALLOW},
		{"bash", `{"command":"rm -rf /"}`, agentv1.ApproverVerdict_APPROVER_VERDICT_DENY},
		{"bash", `{"command":"git status; rm -rf /"}`, agentv1.ApproverVerdict_APPROVER_VERDICT_DENY},
		{"bash", `{"command":"ls $(rm -rf /)"}`, agentv1.ApproverVerdict_APPROVER_VERDICT_DENY},
		{"write", `{"file_path":"a"}`, agentv1.ApproverVerdict_APPROVER_VERDICT_PASS},
	}
	for _, tc := range tests {
		resp, err := c.Approve(ctx, &agentv1.ApproveRequest{SessionId: "s", Execution: &toolsv1.ToolExecution{Name: tc.tool, Arguments: tc.args}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetVerdict() != tc.want {
			t.Errorf("%s %s: %v, want %v", tc.tool, tc.args, resp.GetVerdict(), tc.want)
		}
		if tc.want == agentv1.ApproverVerdict_APPROVER_VERDICT_DENY && resp.GetMessage() == "" {
			t.Errorf("%s: a denial without a message for the model", tc.args)
		}
	}
}
