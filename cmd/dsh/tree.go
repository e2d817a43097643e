package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// sessionsTree prints the lineage of session id: from its root (followed up
// through parent_session) down through every child (ListSessions filtered
// by parent), one line per session with its status and, for a subagent, its
// provider and description; the asked session is marked.
func sessionsTree(ctx context.Context, c agentv1.AgentServiceClient, out io.Writer, id string) error {
	root := id
	for seen := map[string]bool{}; !seen[root]; {
		seen[root] = true
		resp, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: root})
		if err != nil {
			return rpcError("get session", err)
		}
		p := resp.GetSession().GetHeader().GetParentSession()
		if p == "" {
			break
		}
		if _, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: p}); err != nil {
			break // a parent that is gone (or another tenant's) ends the walk
		}
		root = p
	}
	resp, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: root})
	if err != nil {
		return rpcError("get session", err)
	}
	return printTree(ctx, c, out, resp.GetSession(), id, "", "", map[string]bool{})
}

func printTree(ctx context.Context, c agentv1.AgentServiceClient, out io.Writer, s *agentv1.Session, mark, lead, indent string, seen map[string]bool) error {
	h := s.GetHeader()
	seen[h.GetId()] = true
	line := lead + h.GetId() + "  " + statusName(s.GetStatus())
	if sp := h.GetSubagent(); sp != nil {
		line += fmt.Sprintf("  %s %q", strings.ToLower(strings.TrimPrefix(sp.GetMode().String(), "SUBAGENT_MODE_")), sp.GetDescription())
	} else if h.GetParentSession() != "" {
		line += "  fork"
	}
	if h.GetId() == mark {
		line += "  ◀"
	}
	fmt.Fprintln(out, line)
	var kids []*agentv1.Session
	token := ""
	for {
		resp, err := c.ListSessions(ctx, &agentv1.ListSessionsRequest{ParentSession: h.GetId(), PageSize: 500, PageToken: token})
		if err != nil {
			return rpcError("list sessions", err)
		}
		kids = append(kids, resp.GetSessions()...)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for i, k := range kids {
		if seen[k.GetHeader().GetId()] {
			continue
		}
		branch, next := "├─ ", "│  "
		if i == len(kids)-1 {
			branch, next = "└─ ", "   "
		}
		if err := printTree(ctx, c, out, k, mark, indent+branch, indent+next, seen); err != nil {
			return err
		}
	}
	return nil
}

// showDelegation adds a session's subagent facts to `dsh sessions show`:
// what it was delegated, its running children and its token usage with
// its children's.
func showDelegation(out io.Writer, s *agentv1.Session) {
	if sp := s.GetHeader().GetSubagent(); sp != nil {
		fmt.Fprintf(out, "subagent: %s %q (depth %d)\n", strings.ToLower(strings.TrimPrefix(sp.GetMode().String(), "SUBAGENT_MODE_")),
			sp.GetDescription(), s.GetHeader().GetDelegationDepth())
	}
	if kids := s.GetRunningChildren(); len(kids) > 0 {
		fmt.Fprintf(out, "running children: %s\n", strings.Join(kids, ", "))
	}
	if u, c := s.GetUsage(), s.GetChildrenUsage(); u.GetInputTokens()+u.GetOutputTokens()+c.GetInputTokens()+c.GetOutputTokens() > 0 {
		fmt.Fprintf(out, "tokens:   %d in / %d out; subagents %d in / %d out\n", u.GetInputTokens(), u.GetOutputTokens(),
			c.GetInputTokens(), c.GetOutputTokens())
	}
}
