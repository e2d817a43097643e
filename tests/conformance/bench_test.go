package conformance_test

import (
	"context"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/toolstream"
	"github.com/dsh-dev/dsh/tests/conformance/hostproc"
)

// BenchmarkExecuteEcho measures one Execute round trip of conf_echo over
// loopback gRPC against each kind of host (a process for Python and Node, in
// process for Go and the bridge, whose MCP server is a stdio child).
func BenchmarkExecuteEcho(b *testing.B) {
	hosts := []struct {
		name, tool string
		start      func(b *testing.B) string
	}{
		{"go", "conf_echo", func(b *testing.B) string { return goHost(b) }},
		{"python", "conf_echo", func(b *testing.B) string { return hostproc.PythonExample(b, "--conformance") }},
		{"typescript", "conf_echo", func(b *testing.B) string { return hostproc.TypeScriptExample(b, "--conformance") }},
		{"mcpbridge-stdio", "conf__conf_echo", func(b *testing.B) string { return stdioBridge(b) }},
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
				r, _, err := toolstream.Collect(stream)
				if err != nil || r.GetIsError() {
					b.Fatalf("Execute: %v %v", r, err)
				}
			}
		})
	}
}
