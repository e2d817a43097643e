package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// resumeFlags are dsh dev's --continue and --session.
type resumeFlags struct {
	last bool
	id   string
}

func registerResumeFlags(fs *flag.FlagSet) *resumeFlags {
	var r resumeFlags
	fs.BoolVar(&r.last, "continue", false, "resume the last session started in this directory")
	fs.StringVar(&r.id, "session", "", "resume this session")
	return &r
}

// sessionID resolves the flags to the id of the session to resume ("" for a
// new one).
func (r *resumeFlags) sessionID(ctx context.Context, c agentv1.AgentServiceClient, cwd string) (string, error) {
	switch {
	case r.last && r.id != "":
		return "", &exitError{code: 2, msg: "--continue and --session both pick a session: give one"}
	case r.id != "":
		return r.id, nil
	case !r.last:
		return "", nil
	}
	ss, err := remoteSource{c: c}.list(ctx)
	if err != nil {
		return "", err
	}
	var last *sessionv1.SessionHeader
	for _, s := range ss {
		h := s.GetHeader()
		if h.GetCwd() == cwd && h.GetParentSession() == "" && (last == nil || h.GetCreatedAt() >= last.GetCreatedAt()) {
			last = h
		}
	}
	if last == nil {
		return "", &exitError{code: 1, msg: "--continue: no session was started in " + cwd + " (run dsh dev without it to start one)"}
	}
	return last.GetId(), nil
}

// replay renders a resumed session's history (its events below next) before
// the chat prompt, prompts included, then a rule saying it was resumed.
func replay(ctx context.Context, c agentv1.AgentServiceClient, out io.Writer, color bool, reasoning render.ReasoningMode, s *agentv1.Session) error {
	next := s.GetNextSeq()
	if next == 0 {
		return nil
	}
	r := render.New(out, render.Options{Color: color, ShowUser: true, Reasoning: reasoning})
	err := remoteSource{c: c}.events(ctx, s.GetHeader().GetId(), 0, false, func(ev *sessionv1.SessionEvent) error {
		if ev.GetSeq() < next {
			r.Event(ev)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "── resumed session %s (%d events) ──\n", s.GetHeader().GetId(), next)
	return nil
}
