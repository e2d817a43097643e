package main

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func runTools(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "list" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stdout, "Usage: dsh tools list [--addr TOOLHOST] [--json]")
			return nil
		}
		return &exitError{code: 2, msg: "usage: dsh tools list [--addr TOOLHOST] [--json]"}
	}
	fs := newFlags(e, "tools list", "tools list [flags]")
	addr := fs.String("addr", envOr(e, "DSH_TOOLHOST", defaultToolhostAddr), "toolhost address (env DSH_TOOLHOST)")
	cf := registerClientFlags(e, fs)
	asJSON := fs.Bool("json", false, "print JSON, one tool per line")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	conn, err := dialService(ctx, *addr, "toolhost", cf)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := toolsv1.NewToolHostClient(conn).ListTools(ctx, &toolsv1.ListToolsRequest{})
	if err != nil {
		return rpcError("list tools", err)
	}
	var rows [][]string
	for _, t := range resp.GetTools() {
		if *asJSON {
			if err := printJSON(e.stdout, t); err != nil {
				return err
			}
			continue
		}
		desc := t.GetSchema().GetDescription()
		if i := indexNewline(desc); i >= 0 {
			desc = desc[:i]
		}
		if len([]rune(desc)) > 80 {
			desc = string([]rune(desc)[:79]) + "…"
		}
		rows = append(rows, []string{t.GetSchema().GetName(), concurrencyName(t.GetConcurrency()), desc})
	}
	if !*asJSON {
		table(e.stdout, []string{"NAME", "CONCURRENCY", "DESCRIPTION"}, rows)
	}
	return nil
}

func indexNewline(s string) int {
	for i, c := range s {
		if c == '\n' {
			return i
		}
	}
	return -1
}

func concurrencyName(c toolsv1.ConcurrencySafety) string {
	switch c {
	case toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS:
		return "parallel"
	case toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_PER_CALL:
		return "per-call"
	default:
		return "exclusive"
	}
}

func runModels(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "list" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stdout, "Usage: dsh models list [--addr GATEWAY] [--provider NAME] [--json]")
			return nil
		}
		return &exitError{code: 2, msg: "usage: dsh models list [--addr GATEWAY] [--provider NAME] [--json]"}
	}
	fs := newFlags(e, "models list", "models list [flags]")
	addr := fs.String("addr", envOr(e, "DSH_GATEWAY", defaultGatewayAddr), "LLM gateway address (env DSH_GATEWAY)")
	cf := registerClientFlags(e, fs)
	prov := fs.String("provider", "", "only this provider route")
	asJSON := fs.Bool("json", false, "print JSON, one model per line")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	conn, err := dialService(ctx, *addr, "LLM gateway", cf)
	if err != nil {
		return err
	}
	defer conn.Close()
	gw := llmv1.NewLlmGatewayClient(conn)
	provs, err := gw.ListProviders(ctx, &llmv1.ListProvidersRequest{})
	if err != nil {
		return rpcError("list providers", err)
	}
	var rows [][]string
	for _, p := range provs.GetProviders() {
		if *prov != "" && p.GetId() != *prov {
			continue
		}
		ms, err := gw.ListModels(ctx, &llmv1.ListModelsRequest{Provider: p.GetId()})
		if status.Code(err) == codes.Unavailable {
			// The route is registered but cannot say what it serves: show
			// it, say why, and go on with the others.
			fmt.Fprintf(e.stderr, "dsh: %s: %s\n", p.GetId(), status.Convert(err).Message())
			if !*asJSON {
				rows = append(rows, []string{p.GetId(), "?", "", "(models unknown: see above)"})
			}
			continue
		}
		if err != nil {
			return rpcError("list models of "+p.GetId(), err)
		}
		for _, m := range ms.GetModels() {
			if *asJSON {
				if err := printJSON(e.stdout, m); err != nil {
					return err
				}
				continue
			}
			window := ""
			if m.ContextWindow != nil {
				window = strconv.FormatInt(m.GetContextWindow(), 10)
			}
			rows = append(rows, []string{p.GetId(), m.GetId(), window, m.GetName()})
		}
	}
	if !*asJSON {
		table(e.stdout, []string{"PROVIDER", "MODEL", "CONTEXT", "NAME"}, rows)
	}
	return nil
}
