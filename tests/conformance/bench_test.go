package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/dsh-dev/dsh/tests/conformance"
	"github.com/dsh-dev/dsh/tests/conformance/conftools"
)

// BenchmarkExecuteEcho measures one Execute round trip of conf_echo over
// loopback gRPC against each kind of host (a process for Python and Node, in
// process for Go and the bridge, whose MCP server is a stdio child).
func BenchmarkExecuteEcho(b *testing.B) {
	hosts := []struct {
		name, tool string
		start      func(b *testing.B) string
	}{
		{"go", "conf_echo", func(b *testing.B) string {
			host, err := toolsdk.NewHost(toolsdk.HostConfig{})
			if err != nil {
				b.Fatal(err)
			}
			if err := host.Add(conftools.Tools(host)...); err != nil {
				b.Fatal(err)
			}
			return serveInProcess(b, host.Serve)
		}},
		{"python", "conf_echo", func(b *testing.B) string {
			if _, err := os.Stat("/usr/bin/python3"); err != nil {
				b.Skip("Python runtime missing")
			}
			return startProcess(b, "/usr/bin/python3", filepath.Join(repoRoot(b), "sdk", "python", "examples", "csvhost.py"), "--conformance")
		}},
		{"typescript", "conf_echo", func(b *testing.B) string {
			node, err := exec.LookPath("node")
			if err != nil {
				b.Skip("Node.js runtime missing")
			}
			return startProcess(b, node, filepath.Join(repoRoot(b), "sdk", "typescript", "examples", "jsonhost.js"), "--conformance")
		}},
		{"mcpbridge-stdio", "conf__conf_echo", func(b *testing.B) string {
			exe, err := os.Executable()
			if err != nil {
				b.Fatal(err)
			}
			return bridge(b, map[string]mcpbridge.ServerConfig{"conf": {Command: exe, Env: map[string]string{mcpStdioEnv: "1"}}})
		}},
	}
	for _, h := range hosts {
		b.Run(h.name, func(b *testing.B) {
			conn, err := dialer(h.start(b))()
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := toolsv1.NewToolHostClient(conn)
			req := &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{CallId: "b", Name: h.tool, Arguments: `{"text":"hi"}`,
				Context: &toolsv1.ToolContext{SessionId: "bench", Cwd: b.TempDir()}}}
			ctx := context.Background()
			for b.Loop() {
				stream, err := c.Execute(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				r, _, err := conformance.Collect(stream)
				if err != nil || r.GetIsError() {
					b.Fatalf("Execute: %v %v", r, err)
				}
			}
		})
	}
}
