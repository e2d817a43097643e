package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Health names the agent reports on the gRPC health service
// (docs/API.md "Health"). The whole server ("") and HealthService are
// SERVING only while the session store answers, and NOT_SERVING whatever
// the store while the agent starts (it accepts calls before its start is
// over) and while it drains; each dependency has its own name, so a probe
// can tell which one is down.
const (
	// HealthService is the agent as a whole: SERVING while its store is up.
	HealthService = "dsh.agent.v1.AgentService"
	// HealthStore is the session store.
	HealthStore = HealthService + "/store"
)

// HealthToolhost is the health name of the configured toolhost name:
// SERVING while its ListTools/WatchTools answers.
func HealthToolhost(name string) string { return HealthService + "/toolhost/" + name }

// defaultHealthInterval is how often the store is probed.
const defaultHealthInterval = 5 * time.Second

// pinger is a store that can tell whether it serves.
type pinger interface {
	Ping(ctx context.Context) error
}

// pingFunc makes a health check a pinger.
type pingFunc func(ctx context.Context) error

// Ping implements pinger.
func (f pingFunc) Ping(ctx context.Context) error { return f(ctx) }

// statusSetter receives health changes (a grpcserver.Server).
type statusSetter interface {
	SetStatus(name string, serving bool)
}

// depHealth holds the dependencies' health until the gRPC server exists,
// then forwards every change to it.
type depHealth struct {
	store pinger // nil: the store cannot be probed and counts as up
	log   *slog.Logger

	mu     sync.Mutex
	status map[string]bool
	out    statusSetter
	down   bool // starting or draining: the agent as a whole stays NOT_SERVING
}

func newDepHealth(store any, log *slog.Logger) *depHealth {
	p, _ := store.(pinger)
	return &depHealth{store: p, log: log, status: map[string]bool{}}
}

// setProbe sets the store's pinger (before probeStore and run).
func (d *depHealth) setProbe(store any) {
	p, _ := store.(pinger)
	d.mu.Lock()
	d.store = p
	d.mu.Unlock()
}

// set records name's health and forwards it once attached.
func (d *depHealth) set(name string, up bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down && (name == "" || name == HealthService) {
		up = false
	}
	d.status[name] = up
	if d.out != nil {
		d.out.SetStatus(name, up)
	}
}

// hold makes the agent as a whole ("" and HealthService) NOT_SERVING,
// whatever the probes find, until release. While it starts: it accepts
// calls (startGate), and they wait until its store is open and its tools
// are listed, so it is not ready before that whatever the store's first
// probe finds. On shutdown (drain), for good: readiness fails at once so
// the Service stops routing new work here while running turns finish.
func (d *depHealth) hold() {
	d.mu.Lock()
	d.down = true
	d.mu.Unlock()
	d.set("", false)
	d.set(HealthService, false)
}

// release ends hold: the agent as a whole reports what the store's last
// probe found.
func (d *depHealth) release() {
	d.mu.Lock()
	d.down = false
	up := d.status[HealthStore]
	d.mu.Unlock()
	d.set("", up)
	d.set(HealthService, up)
}

// attach forwards the recorded statuses to out, and every later change.
func (d *depHealth) attach(out statusSetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.out = out
	for name, up := range d.status {
		out.SetStatus(name, up)
	}
}

// probeStore pings the store and sets the store's and the whole agent's
// health, logging a change.
func (d *depHealth) probeStore(ctx context.Context) {
	var err error
	if d.store != nil {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = d.store.Ping(pctx)
		cancel()
	}
	if err != nil && ctx.Err() != nil {
		// Cancelled by the caller (a start abandoned, a shutdown): says
		// nothing of the store.
		return
	}
	up := err == nil
	d.mu.Lock()
	was, known := d.status[HealthStore]
	d.mu.Unlock()
	switch {
	case !up && (!known || was):
		d.log.Error("session store is down; the agent reports NOT_SERVING", "err", err)
	case up && known && !was:
		d.log.Info("session store is back; the agent reports SERVING")
	}
	for _, name := range []string{HealthStore, HealthService, ""} {
		d.set(name, up)
	}
}

// run probes the store every interval until ctx ends.
func (d *depHealth) run(ctx context.Context, interval time.Duration) {
	every(ctx, interval, func() { d.probeStore(ctx) })
}
