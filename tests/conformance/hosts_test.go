package conformance_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/dsh-dev/dsh/tests/conformance"
	"github.com/dsh-dev/dsh/tests/conformance/conftools"
	"github.com/dsh-dev/dsh/tests/conformance/hostproc"
	"github.com/dsh-dev/dsh/tests/conformance/mcpconf"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const mcpStdioEnv = "DSH_CONFORMANCE_MCP_STDIO"

// TestMain doubles as the stdio MCP conformance server the bridge starts.
func TestMain(m *testing.M) {
	if os.Getenv(mcpStdioEnv) == "1" {
		if err := mcpconf.NewServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "mcp conformance server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func dialer(addr string) func() (*grpc.ClientConn, error) {
	return func() (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
}

// runBoth runs this suite and the toolsdk's protocol suite
// (toolhostconformance: malformed requests, non-object arguments, ...)
// against one host.
func runBoth(t *testing.T, addr string, opts conformance.Options) {
	t.Run("Conformance", func(t *testing.T) { conformance.Run(t, dialer(addr), opts) })
	t.Run("Protocol", func(t *testing.T) {
		conn, err := dialer(addr)()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		toolhostconformance.Run(t, toolsv1.NewToolHostClient(conn), t.TempDir())
	})
}

func TestPythonHost(t *testing.T) {
	t.Parallel()
	runBoth(t, hostproc.PythonExample(t, "--conformance"), conformance.Options{})
}

func TestTypeScriptHost(t *testing.T) {
	t.Parallel()
	runBoth(t, hostproc.TypeScriptExample(t, "--conformance"), conformance.Options{})
}

func goHost(t testing.TB) string {
	host, err := toolsdk.NewHost(toolsdk.HostConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Add(conftools.Tools(host)...); err != nil {
		t.Fatal(err)
	}
	return hostproc.Serve(t, host.Serve)
}

func TestGoHost(t *testing.T) {
	t.Parallel()
	runBoth(t, goHost(t), conformance.Options{})
}

func stdioBridge(t testing.TB) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return hostproc.Bridge(t, map[string]mcpbridge.ServerConfig{"conf": {Command: exe, Env: map[string]string{mcpStdioEnv: "1"}}})
}

func TestMCPBridgeStdio(t *testing.T) {
	t.Parallel()
	runBoth(t, stdioBridge(t), conformance.Options{Prefix: "conf__", Raw: true, OutputStream: "progress"})
}

func TestMCPBridgeHTTP(t *testing.T) {
	t.Parallel()
	srv := mcpconf.NewServer()
	web := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(web.Close)
	addr := hostproc.Bridge(t, map[string]mcpbridge.ServerConfig{"web": {URL: web.URL}})
	runBoth(t, addr, conformance.Options{Prefix: "web__", Raw: true, OutputStream: "progress"})
}
