// Package debugserver serves a dsh process's diagnostics over HTTP on
// --debug-addr: the net/http/pprof profiles under /debug/pprof/ and the
// process's OpenTelemetry metrics (plus the Go runtime and process
// collectors) in Prometheus text format on /metrics.
//
// It is off by default. Like the gRPC listeners, it binds loopback unless
// told otherwise: a non-loopback --debug-addr is refused without
// --debug-allow-remote, because profiles expose memory contents and timing
// and the endpoint has no authentication.
//
// Wiring: parse the flags, call Flags.Exporter before telemetry.Setup and
// pass its Reader in telemetry.Config.ExtraMetricReaders, then Serve.
package debugserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/cmdline"
)

// Environment variables of the flags.
const (
	EnvAddr        = "DSH_DEBUG_ADDR"
	EnvAllowRemote = "DSH_DEBUG_ALLOW_REMOTE"
)

// Flags are --debug-addr and --debug-allow-remote.
type Flags struct {
	// Addr is the HTTP listen address; empty serves nothing.
	Addr string
	// AllowRemote admits a non-loopback Addr.
	AllowRemote bool
}

// RegisterFlags adds the flags to fs, with defaults from env (a malformed
// DSH_DEBUG_ALLOW_REMOTE is left in env.Err).
func (f *Flags) RegisterFlags(fs *flag.FlagSet, env *cmdline.Env) {
	fs.StringVar(&f.Addr, "debug-addr", env.String(EnvAddr, ""), "serve pprof (/debug/pprof/) and Prometheus metrics (/metrics) over plain HTTP at this address, e.g. 127.0.0.1:6060; off when empty (env "+EnvAddr+")")
	fs.BoolVar(&f.AllowRemote, "debug-allow-remote", env.Bool(EnvAllowRemote, false), "allow a non-loopback --debug-addr (it has no authentication) (env "+EnvAllowRemote+"=true)")
}

// Check refuses a non-loopback address without AllowRemote.
func (f *Flags) Check() error {
	if f.Addr == "" || f.AllowRemote || auth.Loopback(f.Addr) {
		return nil
	}
	return fmt.Errorf("--debug-addr %s is not a loopback address: pprof and metrics have no authentication; bind 127.0.0.1 or pass --debug-allow-remote", f.Addr)
}

// Exporter is the Prometheus side of the process's metrics: a metric reader
// for the meter provider and the registry /metrics serves.
type Exporter struct {
	// Reader goes into telemetry.Config.ExtraMetricReaders.
	Reader sdkmetric.Reader
	reg    *prometheus.Registry
}

// NewExporter builds an Exporter with its own registry (no global state),
// which also carries the Go runtime and process collectors.
func NewExporter() (*Exporter, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("debugserver: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("debugserver: %w", err)
	}
	r, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("debugserver: prometheus exporter: %w", err)
	}
	return &Exporter{Reader: r, reg: reg}, nil
}

// Handler is the debug mux: /metrics and /debug/pprof/.
func (e *Exporter) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Setup is the usual wiring: nil, nil when f.Addr is empty; else it checks
// the address and returns an Exporter to pass to telemetry.Setup.
func (f *Flags) Setup() (*Exporter, error) {
	if f.Addr == "" {
		return nil, nil
	}
	if err := f.Check(); err != nil {
		return nil, err
	}
	return NewExporter()
}

// Readers returns e's reader as a list for telemetry.Config (none for nil).
func (e *Exporter) Readers() []sdkmetric.Reader {
	if e == nil {
		return nil
	}
	return []sdkmetric.Reader{e.Reader}
}

// Serve listens on addr and serves e until ctx ends; it returns once the
// listener is bound (the bound address is logged, for addr ":0"). A nil e
// serves nothing.
func (e *Exporter) Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	if e == nil {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debugserver: %w", err)
	}
	srv := &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("debug server stopped", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	log.Info("debug server listening (pprof, metrics)", "addr", lis.Addr().String())
	return lis.Addr(), nil
}
