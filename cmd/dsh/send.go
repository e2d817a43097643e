package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func runSend(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "send", "send [flags] PROMPT   (PROMPT \"-\" reads standard input)")
	addr := fs.String("addr", envOr(e, "DSH_AGENT", defaultAgentAddr), "agent service address (env DSH_AGENT)")
	cf := registerClientFlags(e, fs)
	var sf sessionFlags
	fs.StringVar(&sf.id, "session", "", "session id (default: create one)")
	fs.StringVar(&sf.provider, "provider", envOr(e, "DSH_PROVIDER", "scripted"), "provider route for a new session (env DSH_PROVIDER)")
	fs.StringVar(&sf.model, "model", envOr(e, "DSH_MODEL", "demo"), "model for a new session (env DSH_MODEL)")
	cwdFlag(e, fs, &sf)
	asJSON := fs.Bool("json", false, "print every event of the turn as JSON lines instead of the answer")
	if err := parse(fs, args); err != nil {
		return err
	}
	prompt, err := promptArg(e, fs.Args())
	if err != nil {
		return err
	}
	conn, err := dialService(ctx, *addr, "agent service", cf)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := agentv1.NewAgentServiceClient(conn)
	s, err := openSession(ctx, c, sf)
	if err != nil {
		return err
	}
	if sf.id == "" {
		fmt.Fprintln(e.stderr, "session", s.GetHeader().GetId())
	}
	return printTurn(ctx, e, c, s, prompt, *asJSON, nil)
}

// promptArg joins the positional arguments; "-" reads stdin.
func promptArg(e *env, args []string) (string, error) {
	if len(args) == 1 && args[0] == "-" {
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return "", err
		}
		args = []string{string(b)}
	}
	p := strings.TrimSpace(strings.Join(args, " "))
	if p == "" {
		return "", &exitError{code: 2, msg: "no prompt given"}
	}
	return p, nil
}

// printTurn runs one prompt and prints its answer (or, as JSON, every
// event); it fails with exit code 1 unless the turn completed. answering,
// when set, is called once the model's first chunk arrives.
func printTurn(ctx context.Context, e *env, c agentv1.AgentServiceClient, s *agentv1.Session, prompt string, asJSON bool, answering func()) error {
	// On a terminal the turn shows as it runs (reasoning, tool cards, the
	// streamed answer); piped, only the answer is printed.
	var live *render.Renderer
	if !asJSON && isTTY(e.stdout) {
		live = render.New(e.stdout, render.Options{Color: useColor(e, e.stdout)})
	}
	onEvent := func(ev *sessionv1.SessionEvent) {
		if live != nil {
			live.Event(ev)
		}
		if answering != nil {
			switch ev.GetPayload().(type) {
			case *sessionv1.SessionEvent_AssistantChunk, *sessionv1.SessionEvent_AssistantMessage, *sessionv1.SessionEvent_TurnEnd:
				answering()
				answering = nil
			}
		}
		if asJSON {
			if b, err := cliJSON(ev); err == nil {
				fmt.Fprintf(e.stdout, "%s\n", b)
			}
		}
	}
	res, err := oneShot(ctx, c, s, prompt, onEvent)
	if err != nil {
		return err
	}
	if !asJSON && live == nil && res.answer != "" {
		fmt.Fprintln(e.stdout, strings.TrimRight(res.answer, "\n"))
	}
	if !res.completed() {
		var buf strings.Builder
		render.New(&buf, render.Options{}).Event(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TurnEnd{TurnEnd: res.end}})
		msg := strings.TrimSpace(buf.String())
		if msg == "" {
			msg = "turn ended: " + render.EndReasonName(res.end.GetReason())
		}
		return &exitError{code: 1, msg: msg}
	}
	return nil
}
