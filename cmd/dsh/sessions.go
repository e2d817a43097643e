package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
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
	data := fs.String("data", envOr(e, "DSH_DATA", ".dsh"), "data directory read when no agent answers (list, show, events, messages; env DSH_DATA)")
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
	src, closeSrc, err := openSource(ctx, e, sub, *addr, *data, cf)
	if err != nil {
		return err
	}
	defer closeSrc()
	out := e.stdout
	switch sub {
	case "list":
		ss, err := src.list(ctx)
		if err != nil {
			return err
		}
		var rows [][]string
		for _, s := range ss {
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
		if !*asJSON {
			table(out, []string{"ID", "STATUS", "CREATED", "MODEL", "TITLE", "CWD"}, rows)
		}
	case "show":
		s, err := src.get(ctx, id)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, s)
		}
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
		r := render.New(out, render.Options{Color: useColor(e, out), ShowUser: true})
		return src.events(ctx, id, *from, *follow, func(ev *sessionv1.SessionEvent) error {
			if !*asJSON {
				r.Event(ev)
				return nil
			}
			return printJSON(out, ev)
		})
	case "tree":
		rs, ok := src.(remoteSource)
		if !ok {
			return &exitError{code: 1, msg: "sessions tree needs a running agent (it lists children through ListSessions)"}
		}
		return sessionsTree(ctx, rs.c, out, id) // tree.go
	case "messages":
		ms, err := src.messages(ctx, id)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if err := printJSON(out, m); err != nil {
				return err
			}
		}
	case "fork":
		c := src.(remoteSource).c
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

// openSource dials the agent; when none answers, list, show, events and
// messages read the local store in data instead, saying so on stderr.
func openSource(ctx context.Context, e *env, sub, addr, data string, cf *clientFlags) (sessionSource, func(), error) {
	conn, err := dialService(ctx, addr, "agent service", cf)
	if err == nil {
		return remoteSource{c: agentv1.NewAgentServiceClient(conn)}, func() { conn.Close() }, nil
	}
	var xe *exitError
	if sub == "fork" || sub == "tree" || !errors.As(err, &xe) || xe.code != 1 {
		// fork writes and tree lists children through ListSessions: both
		// need the agent, so its connection error is the answer.
		return nil, nil, err
	}
	local, path, lerr := openLocal(ctx, data)
	if lerr != nil {
		if path == "" {
			return nil, nil, err // no store there either: the agent error says what to do
		}
		return nil, nil, &exitError{code: 1, msg: fmt.Sprintf("%s; the local store %s: %v", xe.msg, path, lerr)}
	}
	fmt.Fprintf(e.stderr, "dsh: no agent at %s; reading the local store %s (statuses unknown, no live events)\n", addr, path)
	return local, local.close, nil
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
