package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// lineageAgent is a fake agent (the CLI's upstream) holding a fixed set of
// sessions: it answers GetSession and ListSessions filtered by parent.
type lineageAgent struct {
	agentv1.UnimplementedAgentServiceServer
	sessions []*agentv1.Session
}

func (a *lineageAgent) GetSession(_ context.Context, req *agentv1.GetSessionRequest) (*agentv1.GetSessionResponse, error) {
	for _, s := range a.sessions {
		if s.GetHeader().GetId() == req.GetSessionId() {
			return &agentv1.GetSessionResponse{Session: s}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "session %q not found", req.GetSessionId())
}

func (a *lineageAgent) ListSessions(_ context.Context, req *agentv1.ListSessionsRequest) (*agentv1.ListSessionsResponse, error) {
	out := &agentv1.ListSessionsResponse{}
	for _, s := range a.sessions {
		if req.GetParentSession() == "" || s.GetHeader().GetParentSession() == req.GetParentSession() {
			out.Sessions = append(out.Sessions, s)
		}
	}
	return out, nil
}

func TestSessionsTree(t *testing.T) {
	sess := func(id, parent string, st agentv1.AgentStatus, spec *sessionv1.SubagentSpec) *agentv1.Session {
		return &agentv1.Session{Header: &sessionv1.SessionHeader{Id: id, ParentSession: parent, Subagent: spec}, Status: st}
	}
	spawn := func(d string) *sessionv1.SubagentSpec {
		return &sessionv1.SubagentSpec{Description: d, Mode: sessionv1.SubagentMode_SUBAGENT_MODE_SPAWN}
	}
	idle, running := agentv1.AgentStatus_AGENT_STATUS_IDLE, agentv1.AgentStatus_AGENT_STATUS_RUNNING
	fake := &lineageAgent{sessions: []*agentv1.Session{
		sess("root", "", running, nil),
		sess("a", "root", idle, spawn("find the bug")),
		sess("a1", "a", running, &sessionv1.SubagentSpec{Description: "read logs", Mode: sessionv1.SubagentMode_SUBAGENT_MODE_FORK}),
		sess("b", "root", idle, nil),
		sess("other", "", idle, nil),
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, fake)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	fake.sessions[0].RunningChildren = []string{"a"}
	fake.sessions[0].Usage = &llmv1.TokenUsage{InputTokens: 100, OutputTokens: 10}
	fake.sessions[0].ChildrenUsage = &llmv1.TokenUsage{InputTokens: 40, OutputTokens: 4}
	fake.sessions[1].Header.DelegationDepth = 1
	for _, tc := range []struct{ name, cmd, id, want string }{{"from_grandchild", "tree", "a1", ""}, {"from_root", "tree", "root", ""},
		{"show_parent", "show", "root", "running children: a\ntokens:   100 in / 10 out; subagents 40 in / 4 out\n"},
		{"show_child", "show", "a", "parent:   root\nsubagent: spawn \"find the bug\" (depth 1)\n"}} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
				args: []string{"sessions", tc.cmd, "--addr", lis.Addr().String(), tc.id}, getenv: func(string) string { return "" }}
			if code := exitCode(e, run(t.Context(), e)); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if tc.want != "" { // show: the creation time is local, so no golden file
				if !strings.HasSuffix(stdout.String(), tc.want) {
					t.Fatalf("show printed\n%s\nwant it to end with\n%s", stdout.String(), tc.want)
				}
				return
			}
			path := filepath.Join("testdata", "tree_"+tc.name+".txt")
			if *updateTree {
				_ = os.MkdirAll("testdata", 0o755)
				if err := os.WriteFile(path, stdout.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if stdout.String() != string(want) {
				t.Fatalf("got\n%s\nwant\n%s", stdout.String(), want)
			}
		})
	}
}

var updateTree = flag.Bool("update-tree", false, "rewrite testdata/tree_*.txt")
