package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	"github.com/dsh-dev/dsh/internal/events"
)

func runEvents(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "tail" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stdout, "Usage: "+tailUsage)
			return nil
		}
		return &exitError{code: 2, msg: "usage: " + tailUsage}
	}
	fs := newFlags(e, "events tail", "events tail [flags]")
	var conn events.Conn
	conn.RegisterFlags(fs, e.getenv)
	id := fs.String("session", "", "only this session (default: every session)")
	tenant := fs.String("tenant", "", "only this tenant's sessions (default: every tenant the NATS user may read); also the default reply inbox prefix "+events.TenantInboxPrefix("<tenant>"))
	all := fs.Bool("all", false, "replay the stored events first, then follow")
	asJSON := fs.Bool("json", false, "print each event as JSON: {\"tenant\", \"session_id\", \"event\"}")
	status := fs.Bool("status", true, "also show status changes (core NATS)")
	deltas := fs.Bool("deltas", true, "show assistant/chunk deltas; --deltas=false skips them by their Dsh-Delta header, undecoded (the whole answer still shows as assistant/message)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	if conn.URL == "" {
		conn.URL = defaultNATSURL
	}
	conn.Name = "dsh events tail"
	if *tenant != "" && conn.InboxPrefix == "" {
		// A tenant-scoped NATS user may subscribe only to its own inboxes.
		conn.InboxPrefix = events.TenantInboxPrefix(*tenant)
	}
	opts, err := conn.Options()
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	nc, err := nats.Connect(conn.URL, opts...)
	if err != nil {
		return &exitError{code: 1, msg: fmt.Sprintf("no NATS server at %s (is `dsh dev` running? use --nats): %v", conn.URL, err)}
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	subject, statusSubject := tailSubjects(*tenant, *id)
	deliver := jetstream.DeliverNewPolicy
	if *all {
		deliver = jetstream.DeliverAllPolicy
	}
	// The agent creates the stream when it first reaches NATS; wait for it.
	var cons jetstream.Consumer
	waited := false
	for {
		cons, err = js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{subject}, DeliverPolicy: deliver,
		})
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			msg := fmt.Sprintf("subscribe to %s on stream %s: %v", subject, events.StreamName, err)
			if le := nc.LastError(); le != nil {
				// A refused request only times out; the server said why.
				msg += " (" + le.Error() + "; is --tenant the one your NATS user may read?)"
			}
			return &exitError{code: 1, msg: msg}
		}
		if !waited {
			fmt.Fprintf(e.stderr, "waiting for the stream %s to appear on %s…\n", events.StreamName, conn.URL)
			waited = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
	out := e.stdout
	var mu sync.Mutex
	r := render.New(out, render.Options{Color: useColor(e, out), ShowUser: true})
	last := ""
	header := func(tn, sid string) {
		if *id == "" && sid != last && !*asJSON {
			if !r.AtLineStart() {
				fmt.Fprintln(out)
			}
			if *tenant == "" && tn != events.DefaultTenant {
				fmt.Fprintf(out, "── session %s (tenant %s)\n", sid, tn)
			} else {
				fmt.Fprintf(out, "── session %s\n", sid)
			}
		}
		last = sid
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if !*deltas && m.Headers().Get(events.HeaderDelta) == "1" {
			return
		}
		sid, ev, err := events.DecodeEvent(m.Headers(), m.Data())
		tn := tenantOf(m.Headers())
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			fmt.Fprintln(e.stderr, "dsh: skipping a message:", err)
			return
		}
		if *asJSON {
			b, err := cliJSON(ev)
			if err != nil {
				return
			}
			fmt.Fprintf(out, "{\"tenant\":%q,\"session_id\":%q,\"event\":%s}\n", tn, sid, b)
			return
		}
		header(tn, sid)
		r.Event(ev)
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	if *status && !*asJSON {
		sub, err := nc.Subscribe(statusSubject, func(m *nats.Msg) {
			sid, st, err := events.DecodeStatus(m.Header, m.Data)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if !r.AtLineStart() {
				return // do not break a streamed line
			}
			fmt.Fprintf(out, "· %s is %s\n", sid, statusName(st))
		})
		if err != nil {
			return err
		}
		defer sub.Unsubscribe()
	}
	fmt.Fprintf(e.stderr, "following %s on %s (Ctrl-C to stop)\n", subject, conn.URL)
	<-ctx.Done()
	return nil
}

const tailUsage = "dsh events tail [--tenant T] [--session ID] [--all] [--nats URL] [--json]"

// tailSubjects are the event and status subjects tail follows: every
// tenant's, one tenant's, or one session's (of the given tenant or any).
func tailSubjects(tenant, id string) (string, string) {
	switch {
	case id != "" && tenant != "":
		return events.EventSubject(tenant, id), events.StatusSubject(tenant, id)
	case id != "":
		return events.SessionEvents(id), events.SessionStatus(id)
	case tenant != "":
		return events.TenantEvents(tenant), events.TenantStatus(tenant)
	}
	return events.AllEvents, events.AllStatus
}

// tenantOf is the tenant named by a message's Dsh-Tenant header, decoded.
func tenantOf(h nats.Header) string {
	tok := h.Get(events.HeaderTenant)
	if t, err := events.DecodeSubjectToken(tok); err == nil && t != "" {
		return t
	}
	return events.DefaultTenant
}
