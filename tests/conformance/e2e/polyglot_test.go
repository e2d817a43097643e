// Package e2e_test runs one agent turn (scripted provider through the real
// gateway) that calls a Python tool, a TypeScript tool and an MCP tool, each
// served by its own toolhost process or bridge.
package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/llmgateway"
	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/dsh-dev/dsh/tests/conformance/hostproc"
	"github.com/dsh-dev/dsh/tests/conformance/mcpconf"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const mcpStdioEnv = "DSH_E2E_MCP_STDIO"

func TestMain(m *testing.M) {
	if os.Getenv(mcpStdioEnv) == "1" {
		if err := mcpconf.NewServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "mcp server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const script = `{"turns": [[
 {"text": "Asking three hosts.", "tool_calls": [
   {"id": "py1", "name": "csv_summary", "arguments": {"path": "people.csv"}},
   {"id": "ts1", "name": "json_query", "arguments": {"json": "{\"a\":[1,2]}", "query": ".a[*]"}},
   {"id": "mcp1", "name": "conf__conf_echo", "arguments": {"text": "from mcp", "mode": "upper"}},
   {"id": "mcp2", "name": "conf__conf_stream", "arguments": {"count": 3}}]},
 {"text": "All three answered."}
]]}`

func TestOneTurnCallsPythonTypeScriptAndMCPTools(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "people.csv"), []byte("name,age\nann,31\nbob,45\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pyAddr := hostproc.PythonExample(t)
	tsAddr := hostproc.TypeScriptExample(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	mcpAddr := hostproc.Bridge(t, map[string]mcpbridge.ServerConfig{"conf": {Command: exe, Env: map[string]string{mcpStdioEnv: "1"}}})

	gw, err := llmgateway.New(llmgateway.Config{Routes: []llmgateway.RouteConfig{{Name: "scripted", Kind: "scripted", Script: script}}},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	gs := grpc.NewServer()
	gw.Register(gs)
	gwLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(gwLis)
	t.Cleanup(gs.Stop)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.ServerConfig{Listener: lis, Gateway: gwLis.Addr().String(),
			Toolhosts: []string{"py=" + pyAddr, "ts=" + tsAddr, "mcp=" + mcpAddr},
			DataDir:   t.TempDir(), ShutdownTimeout: 10 * time.Second}, slog.New(slog.NewTextHandler(hostproc.LogWriter(t, "agent: "), &slog.HandlerOptions{Level: slog.LevelWarn})))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := agentv1.NewAgentServiceClient(conn)

	created, err := client.CreateSession(t.Context(), &agentv1.CreateSessionRequest{Cwd: ws,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSession().GetHeader().GetId()
	// A client following with progress sees the MCP tool's progress
	// notifications live, before the call's tool/result.
	live, err := client.StreamEvents(t.Context(), &agentv1.StreamEventsRequest{SessionId: id, IncludeProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	liveDone := make(chan []string, 1)
	go func() {
		var seen []string
		defer func() { liveDone <- seen }()
		for {
			m, err := live.Recv()
			if err != nil {
				return
			}
			if p := m.GetProgress(); p != nil && p.GetCallId() == "mcp2" {
				seen = append(seen, p.GetOutput().GetText())
			}
			if r := m.GetEvent().GetToolResult(); r != nil && r.GetCallId() == "mcp2" {
				seen = append(seen, "result")
			}
			if m.GetEvent().GetTurnEnd() != nil {
				return
			}
		}
	}()
	if _, err := client.Send(t.Context(), &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("use all three hosts")}}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer wcancel()
	if _, err := client.WaitIdle(wctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
		t.Fatal(err)
	}

	events := allEvents(t, client, id)
	if err := session.CheckLog(events); err != nil {
		t.Fatalf("log invariants: %v", err)
	}
	results := map[string]*sessionv1.ToolResult{}
	views := map[string]bool{}
	var end *sessionv1.TurnEnd
	for _, ev := range events {
		if r := ev.GetToolResult(); r != nil {
			results[r.GetCallId()] = r
		}
		if c := ev.GetToolCall(); c != nil && c.GetView() != nil {
			views[c.GetCallId()] = true
		}
		if e := ev.GetTurnEnd(); e != nil {
			end = e
		}
	}
	want := map[string]string{
		"py1":  "people.csv: 2 rows, 2 columns\n- name: text, 2 distinct, empty 0; top: ann (1), bob (1)\n- age: number, min 31, max 45, mean 38, empty 0",
		"ts1":  "1\n2",
		"mcp1": "FROM MCP",
		"mcp2": "streamed 3",
	}
	for id, text := range want {
		r := results[id]
		if r == nil {
			t.Errorf("no tool/result for %s", id)
			continue
		}
		var got strings.Builder
		for _, b := range r.GetContent() {
			got.WriteString(b.GetText().GetText())
		}
		if r.GetIsError() || got.String() != text {
			t.Errorf("%s: is_error %v, text %q, want %q", id, r.GetIsError(), got.String(), text)
		}
	}
	if seen := <-liveDone; strings.Join(seen, "") != "chunk 1\nchunk 2\nchunk 3\nresult" {
		t.Errorf("live stream of mcp2: %q, want its three progress chunks, then the result", seen)
	}
	if end.GetReason().GetCompleted() == nil {
		t.Errorf("turn ended %v, want completed", end)
	}
	// The presenters ran in the hosts that own the tools (Python, Node) and
	// the cards were stored on the events.
	for _, id := range []string{"py1", "ts1"} {
		if !views[id] {
			t.Errorf("tool/call %s has no call view", id)
		}
	}
	if got := results["py1"].GetView().GetGeneric().GetTitle(); got != "people.csv: 2 rows, 2 columns" {
		t.Errorf("py1 result view title = %q", got)
	}
	if got := results["ts1"].GetView().GetGeneric().GetTitle(); got != "2 matches" {
		t.Errorf("ts1 result view title = %q", got)
	}
}

func allEvents(t *testing.T, c agentv1.AgentServiceClient, id string) []*sessionv1.SessionEvent {
	t.Helper()
	st, err := c.StreamEvents(t.Context(), &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []*sessionv1.SessionEvent
	for {
		resp, err := st.Recv()
		if err != nil {
			return out
		}
		out = append(out, resp.GetEvent())
	}
}
