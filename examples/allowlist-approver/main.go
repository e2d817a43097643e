// Command allowlist-approver is an example dsh.agent.v1.Approver: it allows
// bash commands whose program is on an allow-list, denies any other bash
// command with a reason the model sees, and passes every other tool to the
// person at the chat. Run it and point the agent at it:
//
//	DSH_ALLOW="ls,cat,git" go run ./examples/allowlist-approver &
//	agent --approver allowlist=127.0.0.1:7710,timeout=2s
package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
)

type approver struct {
	agentv1.UnimplementedApproverServer
	allow []string
}

func (a approver) Approve(_ context.Context, req *agentv1.ApproveRequest) (*agentv1.ApproveResponse, error) {
	ex := req.GetExecution()
	if ex.GetName() != "bash" {
		return &agentv1.ApproveResponse{Verdict: agentv1.ApproverVerdict_APPROVER_VERDICT_PASS}, nil
	}
	var args struct{ Command string }
	_ = json.Unmarshal([]byte(ex.GetArguments()), &args)
	words := strings.Fields(args.Command)
	// One simple command only: anything that chains or substitutes is denied.
	if len(words) > 0 && slices.Contains(a.allow, words[0]) && !strings.ContainsAny(args.Command, ";&|`$<>()\n") {
		return &agentv1.ApproveResponse{Verdict: agentv1.ApproverVerdict_APPROVER_VERDICT_ALLOW}, nil
	}
	return &agentv1.ApproveResponse{Verdict: agentv1.ApproverVerdict_APPROVER_VERDICT_DENY,
		Message: "only these programs may run, one at a time: " + strings.Join(a.allow, ", ")}, nil
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	addr := os.Getenv("DSH_LISTEN")
	if addr == "" {
		addr = "127.0.0.1:7710"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("listen", "err", err)
		os.Exit(1)
	}
	srv := grpcserver.New(grpcserver.Config{Logger: log})
	agentv1.RegisterApproverServer(srv.Server, approver{allow: strings.Split(os.Getenv("DSH_ALLOW"), ",")})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := srv.Serve(ctx, lis); err != nil {
		log.Error("serve", "err", err)
		os.Exit(1)
	}
}
