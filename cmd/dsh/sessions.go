package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

func runSessions(ctx context.Context, e *env, args []string) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	fs := newFlags(e, "sessions "+sub, "sessions list|show ID|events ID|messages ID|fork ID|tree ID [flags]")
	addr := fs.String("addr", envOr(e, "DSH_AGENT", defaultAgentAddr), "agent service address (env DSH_AGENT)")
	cf := registerClientFlags(e, fs)
	asJSON := fs.Bool("json", false, "print JSON, one object per line")
	at := fs.Int64("at", -1, "fork: the turn/end seq to fork at (default the last event)")
	newID := fs.String("id", "", "fork: the child's id (minted when empty)")
	from := fs.Int64("from", 0, "events: first seq")
	follow := fs.Bool("follow", false, "events: keep following live events")
	switch sub {
	case "list", "show", "events", "messages", "fork", "tree":
	case "", "-h", "--help", "help":
		fs.Usage()
		if sub == "" {
			return &exitError{code: 2}
		}
		return nil
	default:
		fs.Usage()
		return &exitError{code: 2, msg: fmt.Sprintf("unknown sessions command %q", sub)}
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	id := fs.Arg(0)
	if sub != "list" && id == "" {
		return &exitError{code: 2, msg: "sessions " + sub + " needs a session id"}
	}
	conn, err := dialService(ctx, *addr, "agent service", cf)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := agentv1.NewAgentServiceClient(conn)
	out := e.stdout
	switch sub {
	case "list":
		var rows [][]string
		token := ""
		for {
			resp, err := c.ListSessions(ctx, &agentv1.ListSessionsRequest{PageSize: 500, PageToken: token})
			if err != nil {
				return rpcError("list sessions", err)
			}
			for _, s := range resp.GetSessions() {
				if *asJSON {
					if err := printJSON(out, s); err != nil {
						return err
					}
					continue
				}
				h := s.GetHeader()
				rows = append(rows, []string{h.GetId(), statusName(s.GetStatus()),
					time.UnixMilli(h.GetCreatedAt()).Local().Format("2006-01-02 15:04"),
					h.GetOptions().GetProvider() + "/" + h.GetOptions().GetModel(), s.GetTitle(), h.GetCwd()})
			}
			token = resp.GetNextPageToken()
			if token == "" {
				break
			}
		}
		if !*asJSON {
			table(out, []string{"ID", "STATUS", "CREATED", "MODEL", "TITLE", "CWD"}, rows)
		}
	case "show":
		resp, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
		if err != nil {
			return rpcError("get session", err)
		}
		if *asJSON {
			return printJSON(out, resp.GetSession())
		}
		s := resp.GetSession()
		h := s.GetHeader()
		fmt.Fprintf(out, "id:       %s\nstatus:   %s\ncreated:  %s\nmodel:    %s/%s\ncwd:      %s\nevents:   %d\n",
			h.GetId(), statusName(s.GetStatus()), time.UnixMilli(h.GetCreatedAt()).Local().Format(time.RFC3339),
			h.GetOptions().GetProvider(), h.GetOptions().GetModel(), h.GetCwd(), s.GetNextSeq())
		if s.GetTitle() != "" {
			fmt.Fprintf(out, "title:    %s\n", s.GetTitle())
		}
		if h.GetParentSession() != "" {
			fmt.Fprintf(out, "parent:   %s\n", h.GetParentSession())
		}
		if s.OpenTurn != nil {
			fmt.Fprintf(out, "open turn: %d\n", s.GetOpenTurn())
		}
		showDelegation(out, s) // tree.go
	case "events":
		stream, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: *from, NoFollow: !*follow})
		if err != nil {
			return rpcError("stream events", err)
		}
		r := render.New(out, render.Options{Color: useColor(e, out), ShowUser: true})
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return rpcError("stream events", err)
			}
			if *asJSON {
				b, err := session.MarshalEventJSON(resp.GetEvent())
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "%s\n", b)
				continue
			}
			r.Event(resp.GetEvent())
		}
	case "tree":
		return sessionsTree(ctx, c, out, id) // tree.go
	case "messages":
		resp, err := c.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: id})
		if err != nil {
			return rpcError("get messages", err)
		}
		for _, m := range resp.GetMessages() {
			if err := printJSON(out, m); err != nil {
				return err
			}
		}
	case "fork":
		req := &agentv1.ForkSessionRequest{SessionId: id, NewSessionId: *newID}
		if *at >= 0 {
			req.BoundarySeq = at
		}
		resp, err := c.ForkSession(ctx, req)
		if err != nil {
			return rpcError("fork session", err)
		}
		if *asJSON {
			return printJSON(out, resp.GetSession())
		}
		fmt.Fprintln(out, resp.GetSession().GetHeader().GetId())
	}
	return nil
}

func statusName(s agentv1.AgentStatus) string {
	switch s {
	case agentv1.AgentStatus_AGENT_STATUS_IDLE:
		return "idle"
	case agentv1.AgentStatus_AGENT_STATUS_RUNNING:
		return "running"
	case agentv1.AgentStatus_AGENT_STATUS_DISPOSED:
		return "disposed"
	case agentv1.AgentStatus_AGENT_STATUS_UNLOADED:
		return "unloaded"
	default:
		return strconv.Itoa(int(s))
	}
}
