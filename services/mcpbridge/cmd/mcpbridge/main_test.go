package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const stdioEnv = "MCPBRIDGE_MAIN_TEST_STDIO"

func TestMain(m *testing.M) {
	if os.Getenv(stdioEnv) == "1" {
		s := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "v1"}, nil)
		for _, name := range []string{"one", "two"} {
			s.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name}}}, nil
				})
		}
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"servers":{"a__b":{"command":"x"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no config", nil, nil, "--config (or DSH_MCP_CONFIG) is required"},
		{"missing file", []string{"--config", filepath.Join(dir, "nope.json")}, nil, "no such file"},
		{"invalid config", []string{"--config", bad}, nil, `server name "a__b"`},
		{"bad flag", []string{"--nope"}, nil, "flag provided but not defined"},
		// A variable that does not parse stops the bridge, flag or not;
		// empty and well-formed ones are taken (on to the next error).
		{"malformed DSH_INSECURE", nil, map[string]string{"DSH_INSECURE": "maybe"}, `DSH_INSECURE="maybe": not a boolean`},
		{"malformed DSH_INSECURE under its flag", []string{"--insecure"}, map[string]string{"DSH_INSECURE": "maybe"}, `DSH_INSECURE="maybe": not a boolean`},
		{"empty DSH_INSECURE", nil, map[string]string{"DSH_INSECURE": ""}, "--config (or DSH_MCP_CONFIG) is required"},
		{"DSH_INSECURE off", nil, map[string]string{"DSH_INSECURE": "0"}, "--config (or DSH_MCP_CONFIG) is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := run(t.Context(), c.args, func(k string) string { return c.env[k] }, io.Discard, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunServesConfiguredServers runs main's body with a config file (from
// DSH_MCP_CONFIG) naming a stdio server, then stops it like SIGTERM would.
func TestRunServesConfiguredServers(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"servers": map[string]any{"conf": map[string]any{"command": exe, "env": map[string]string{stdioEnv: "1"}}}})
	path := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		return map[string]string{"DSH_MCP_CONFIG": path, "DSH_LISTEN": "127.0.0.1:0"}[k]
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, getenv, &out, slog.New(slog.DiscardHandler)) }()
	re := regexp.MustCompile(`^dsh-toolhost listening on (\S+)\n`)
	var addr string
	deadline := time.Now().Add(30 * time.Second)
	for addr == "" {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no listening line; stdout %q", out.String())
		} else {
			time.Sleep(5 * time.Millisecond) // polling stdout of the running command
		}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := toolsv1.NewToolHostClient(conn)
	for {
		resp, err := c.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
		if err == nil && len(resp.GetTools()) == 3 { // conf__one, conf__two, mcp_read_resource
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools never listed: %v %v", resp, err)
		}
		time.Sleep(5 * time.Millisecond) // polling the bridge's first sync
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}

// The transport flags: a plaintext non-loopback listener needs --insecure,
// and --allow-peer needs client certificates.
func TestTransportFlags(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:0"}, "--insecure"},
		{[]string{"--listen", "127.0.0.1:0", "--allow-peer", "spiffe://dsh/agent"}, "--allow-peer needs --tls-client-ca"},
		{[]string{"--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem"}, "--tls-key"},
	} {
		err := run(t.Context(), tc.args, none, io.Discard, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}
