package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func runChat(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "chat", "chat [flags]")
	addr := fs.String("addr", envOr(e, "DSH_AGENT", defaultAgentAddr), "agent service address (env DSH_AGENT)")
	cf := registerClientFlags(e, fs)
	var sf sessionFlags
	fs.StringVar(&sf.id, "session", "", "resume this session (default: create one)")
	fs.StringVar(&sf.provider, "provider", envOr(e, "DSH_PROVIDER", "scripted"), "provider route for a new session (env DSH_PROVIDER)")
	fs.StringVar(&sf.model, "model", envOr(e, "DSH_MODEL", "demo"), "model for a new session (env DSH_MODEL)")
	cwdFlag(e, fs, &sf)
	reasoning := reasoningFlag(e, fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	mode, err := reasoningMode(*reasoning)
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
	return chatLoop(ctx, e, c, s, mode)
}

func reasoningFlag(e *env, fs *flag.FlagSet) *string {
	return fs.String("reasoning", envOr(e, "DSH_REASONING", "full"), "how reasoning shows: full (dimmed), collapsed (one line) or hidden; /reasoning toggles it in the chat (env DSH_REASONING)")
}

func reasoningMode(s string) (render.ReasoningMode, error) {
	m, ok := render.ParseReasoningMode(s)
	if !ok {
		return 0, &exitError{code: 2, msg: fmt.Sprintf("--reasoning %q: use full, collapsed or hidden", s)}
	}
	return m, nil
}

// screen serialises terminal output: rendered events, the prompt and the
// spinner.
type screen struct {
	mu       sync.Mutex
	w        io.Writer
	r        *render.Renderer
	color    bool
	spin     bool // a spinner frame is on the current line
	spinTail int  // live-tail lines drawn below the spinner
	frame    int
	waiting  bool   // a prompt is shown
	asking   bool   // an approval or question card waits for an answer
	gauge    string // the context meter shown before the prompt (compactcmd.go)
}

func (s *screen) style(code, text string) string {
	if !s.color {
		return text
	}
	return "\x1b[" + code + "m" + text + "\x1b[0m"
}

func (s *screen) dim(text string) string  { return s.style("2", text) }
func (s *screen) bold(text string) string { return s.style("1", text) }

func (s *screen) setAsking(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asking = on
	if on {
		s.clearSpinner()
	}
}

// ask shows an answer prompt for an open request.
func (s *screen) ask(label string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearSpinner()
	fmt.Fprint(s.w, s.style("1;33", label))
	s.waiting = true
}

var spinnerFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func (s *screen) clearSpinner() {
	if s.spin {
		if s.spinTail > 0 {
			fmt.Fprintf(s.w, "\x1b[%dA\r\x1b[J", s.spinTail) // up to the spinner, erase below
		} else {
			fmt.Fprint(s.w, "\r\x1b[K")
		}
		s.spin, s.spinTail = false, 0
	}
}

// progress takes a running call's live output: the renderer keeps its
// tail, which the next tick draws under the spinner (or, without a
// terminal, prints the lines).
func (s *screen) progress(p *agentv1.ToolProgress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.r.Options().PrintProgress {
		s.clearSpinner()
	}
	s.r.Progress(p)
}

func (s *screen) event(ev *sessionv1.SessionEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearSpinner()
	s.r.Event(ev)
}

func (s *screen) println(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearSpinner()
	if !s.r.AtLineStart() {
		fmt.Fprintln(s.w)
	}
	fmt.Fprintln(s.w, text)
}

func (s *screen) prompt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearSpinner()
	p := "› "
	if s.color {
		p = "\x1b[1m› \x1b[0m"
	}
	if s.gauge != "" {
		p = s.dim("["+s.gauge+"]") + " " + p
	}
	fmt.Fprint(s.w, p)
	s.waiting = true
}

// tick draws the next spinner frame while a tool runs.
func (s *screen) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	running := s.r.Running()
	if len(running) == 0 || !s.r.AtLineStart() || s.asking {
		s.clearSpinner()
		return
	}
	s.frame = (s.frame + 1) % len(spinnerFrames)
	label := fmt.Sprintf("%s running %s…", spinnerFrames[s.frame], strings.Join(running, ", "))
	if s.color {
		label = "\x1b[2m" + label + "\x1b[0m"
	}
	s.clearSpinner()
	tail := s.r.LiveTail()
	for _, l := range tail {
		label += "\n" + l
	}
	fmt.Fprint(s.w, label)
	s.spin, s.spinTail = true, len(tail)
}

// chatLoop runs the interactive chat on an open session. Ctrl-C cancels the
// running turn; a second Ctrl-C (or Ctrl-D, or /exit) leaves.
// waitDrained sends the session's next seq once it is idle (or the current
// one when waiting fails).
func waitDrained(ctx context.Context, c agentv1.AgentServiceClient, id string) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		resp, err := c.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id})
		if err != nil {
			out <- 0
			return
		}
		out <- resp.GetSession().GetNextSeq()
	}()
	return out
}

func chatLoop(ctx context.Context, e *env, c agentv1.AgentServiceClient, s *agentv1.Session, reasoning render.ReasoningMode) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(e.stdin)
		sc.Buffer(make([]byte, 64*1024), 4<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-sctx.Done():
				return
			}
		}
	}()
	for {
		next, err := chatSession(ctx, e, c, s, reasoning, lines)
		if next == nil {
			return err
		}
		s = next // /new or /resume
	}
}

// chatSession chats in session s until the input ends or the user leaves
// (nil), or asks for another session with /new or /resume (that session).
func chatSession(ctx context.Context, e *env, c agentv1.AgentServiceClient, s *agentv1.Session, reasoning render.ReasoningMode, lines <-chan string) (*agentv1.Session, error) {
	out := e.stdout
	scr := &screen{w: out, color: useColor(e, out)}
	// A terminal redraws running calls' live output under the spinner;
	// other output gets the lines as they come.
	scr.r = render.New(out, render.Options{Color: scr.color, Reasoning: reasoning, PrintProgress: !isTTY(out)})
	id := s.GetHeader().GetId()
	if err := replay(ctx, c, out, scr.color, reasoning, s); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	evc, errc, err := followStream(sctx, c, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: s.GetNextSeq(), IncludeProgress: true},
		func(r *agentv1.StreamEventsResponse) (*agentv1.StreamEventsResponse, bool) { return r, true })
	if err != nil {
		return nil, err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)

	if isTTY(out) {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		go func() {
			for {
				select {
				case <-t.C:
					scr.tick()
				case <-sctx.Done():
					return
				}
			}
		}()
	}

	title := ""
	if s.GetTitle() != "" {
		title = " · " + s.GetTitle()
	}
	scr.println(fmt.Sprintf("session %s%s · %s/%s · Ctrl-C cancels a turn, Ctrl-D exits, /help",
		id, title, s.GetHeader().GetOptions().GetProvider(), s.GetHeader().GetOptions().GetModel()))
	busy := s.GetStatus() == agentv1.AgentStatus_AGENT_STATUS_RUNNING
	scr.setGauge(s.GetContext())
	ask := newAsker(c, id, scr, s.GetPending())
	if ask.active() {
		ask.show()
	} else if !busy {
		scr.prompt()
	}
	interrupted := false
	// Piped input (`echo "prompt" | dsh dev`) ends before its turns do: at
	// its end the chat waits for the session to be idle and shows every
	// event up to then, so no prompt is dropped.
	var drained <-chan int64 // the next seq once idle, after piped input ended
	shown := s.GetNextSeq()
	piped := !isTTY(e.stdin)
	for {
		// Piped input is a script: its next line waits for the running turn
		// to end (an answer to an approval or question card excepted), so
		// `printf 'prompt\n/compact\n' | dsh dev` compacts after the answer.
		in := lines
		if piped && busy && !ask.active() {
			in = nil
		}
		select {
		case next := <-drained:
			for shown < next {
				resp, ok := <-evc
				if !ok {
					break
				}
				if p := resp.GetProgress(); p != nil {
					scr.progress(p)
					continue
				}
				ev := resp.GetEvent()
				scr.event(ev)
				shown = ev.GetSeq() + 1
			}
			scr.println("bye")
			return nil, nil
		case resp, ok := <-evc:
			if !ok {
				return nil, &exitError{code: 1, msg: fmt.Sprintf("event stream ended: %v", <-errc)}
			}
			if p := resp.GetProgress(); p != nil {
				scr.progress(p) // live output of a running call: its card's tail
				continue
			}
			ev := resp.GetEvent()
			shown = ev.GetSeq() + 1
			scr.event(ev)
			ask.event(ctx, ev)
			switch ev.GetPayload().(type) {
			case *sessionv1.SessionEvent_TurnStart:
				busy = true
			case *sessionv1.SessionEvent_TurnEnd:
				busy = false
				interrupted = false // back at the prompt: Ctrl-C asks again
				scr.refreshGauge(ctx, c, id)
				scr.prompt()
			}
		case line, ok := <-in:
			if !ok && piped && drained == nil {
				lines, drained = nil, waitDrained(ctx, c, id)
				continue
			}
			if !ok {
				scr.println("bye")
				return nil, nil
			}
			interrupted = false
			if ask.active() {
				ask.answer(ctx, line)
				continue
			}
			line = strings.TrimSpace(line)
			if slashUpdate(ctx, c, id, line, scr.println) {
				if !busy {
					scr.prompt()
				}
				continue
			}
			if compactCommand(ctx, c, id, line, scr) {
				if !busy {
					scr.prompt()
				}
				continue
			}
			if next, handled, err := sessionCommand(ctx, c, s, line, scr); handled {
				if err != nil {
					scr.println(err.Error())
				}
				if next != nil {
					return next, nil
				}
				if !busy {
					scr.prompt()
				}
				continue
			}
			switch line {
			case "":
				if !busy {
					scr.prompt()
				}
				continue
			case "/exit", "/quit":
				scr.println("bye")
				return nil, nil
			case "/reasoning", "/reasoning full", "/reasoning collapsed", "/reasoning hidden":
				scr.mu.Lock()
				next := (scr.r.Reasoning() + 1) % 3
				if arg := strings.TrimSpace(strings.TrimPrefix(line, "/reasoning")); arg != "" {
					next, _ = render.ParseReasoningMode(arg)
				}
				scr.r.SetReasoning(next)
				scr.mu.Unlock()
				scr.println("reasoning: " + [...]string{"full", "collapsed", "hidden"}[next])
				if !busy {
					scr.prompt()
				}
				continue
			case "/help":
				scr.println(chatHelp)
				if !busy {
					scr.prompt()
				}
				continue
			}
			if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: textPrompt(line), RequestId: requestID()}); err != nil {
				scr.println("send failed: " + rpcError("send", err).Error())
				scr.prompt()
				continue
			}
			busy = true
		case <-sig:
			if interrupted {
				scr.println("bye")
				return nil, nil
			}
			interrupted = true
			if busy {
				if _, err := c.Cancel(ctx, &agentv1.CancelRequest{SessionId: id, Cause: agentv1.CancelCause_CANCEL_CAUSE_USER}); err != nil {
					scr.println("cancel failed: " + rpcError("cancel", err).Error())
				} else {
					scr.println("cancelling… (Ctrl-C again to exit)")
				}
				continue
			}
			scr.println("(Ctrl-C again or Ctrl-D to exit)")
			scr.prompt()
		case <-ctx.Done():
			return nil, nil
		}
	}
}
