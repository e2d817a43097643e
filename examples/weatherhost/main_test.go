package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// TestWeatherhostBinary builds the example, runs it as a real process, talks
// to it over gRPC like an agent would, and stops it with SIGINT.
func TestWeatherhostBinary(t *testing.T) {
	bin := proctest.Build(t, ".", "weatherhost")
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DSH_LISTEN="+addr)
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
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	proctest.WaitServing(ctx, t, conn, toolsdk.ServiceName)
	c := toolsv1.NewToolHostClient(conn)
	list, err := c.ListTools(ctx, &toolsv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := list.GetTools()[0].GetSchema().GetParameters(); got != `{"type":"object","properties":{"city":{"type":"string","description":"City name"},"units":{"type":"string","enum":["metric","imperial"]}},"required":["city"]}` {
		t.Errorf("schema %s", got)
	}
	for args, want := range map[string]string{
		`{"city":"Paris"}`:                     "Sunny, 22°C in Paris",
		`{"city":"Austin","units":"imperial"}`: "Sunny, 72°F in Austin",
		`{"units":"kelvin"}`:                   `Error: invalid arguments: missing required property "city"; "units" must be one of [metric, imperial]`,
	} {
		st, err := c.Execute(ctx, &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{
			CallId: "c", Name: "weather", Arguments: args, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, toolsdk.ResultText(m.GetResult().GetContent())); diff != "" {
			t.Errorf("%s (-want +got):\n%s", args, diff)
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("weatherhost exited with %v after SIGINT, want a clean exit", err)
		}
	case <-ctx.Done():
		t.Fatal("weatherhost did not stop on SIGINT")
	}
}
