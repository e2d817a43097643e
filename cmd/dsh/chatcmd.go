package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"google.golang.org/protobuf/proto"
)

// chatHelp is the chat's /help.
const chatHelp = "/new  start a new session · /sessions  list sessions · /resume ID  switch to a session (its history first) · " +
	"/clear  clear the screen · /model [PROVIDER/]MODEL  switch the model · /approval never|on-request|always · " +
	"/reasoning [full|collapsed|hidden]  how reasoning shows · /compact  summarize the older context · /exit  leave · Ctrl-C cancels a turn · Ctrl-D exits"

// sessionCommand runs the chat commands that work on sessions (/new,
// /sessions, /resume ID, /clear). handled reports whether line was one;
// next is the session to switch to.
func sessionCommand(ctx context.Context, c agentv1.AgentServiceClient, cur *agentv1.Session, line string, scr *screen) (next *agentv1.Session, handled bool, err error) {
	word, arg, _ := strings.Cut(line, " ")
	arg = strings.TrimSpace(arg)
	switch word {
	case "/new":
		h := cur.GetHeader()
		resp, err := c.CreateSession(ctx, &agentv1.CreateSessionRequest{RequestId: requestID(), Cwd: h.GetCwd(), Options: proto.CloneOf(h.GetOptions())})
		if err != nil {
			return nil, true, rpcError("new session", err)
		}
		return resp.GetSession(), true, nil
	case "/resume":
		if arg == "" {
			return nil, true, fmt.Errorf("usage: /resume ID (/sessions lists them)")
		}
		resp, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: arg})
		if err != nil {
			return nil, true, rpcError("resume "+arg, err)
		}
		return resp.GetSession(), true, nil
	case "/sessions":
		ss, err := remoteSource{c: c}.list(ctx)
		if err != nil {
			return nil, true, err
		}
		var b strings.Builder
		for _, s := range ss {
			h := s.GetHeader()
			mark := " "
			if h.GetId() == cur.GetHeader().GetId() {
				mark = "*"
			}
			fmt.Fprintf(&b, "%s %s  %s  %s/%s  %s\n", mark, h.GetId(), time.UnixMilli(h.GetCreatedAt()).Local().Format("2006-01-02 15:04"),
				h.GetOptions().GetProvider(), h.GetOptions().GetModel(), h.GetCwd())
		}
		scr.println(strings.TrimRight(b.String(), "\n"))
		return nil, true, nil
	case "/clear":
		if scr.color {
			scr.println("\x1b[2J\x1b[H")
		}
		return nil, true, nil
	}
	return nil, false, nil
}
