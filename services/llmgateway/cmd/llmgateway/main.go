// Command llmgateway serves dsh.llm.v1.LlmGateway. Flags default from
// environment variables; provider routes come from the conventional
// variables (DEEPSEEK_API_KEY, ANTHROPIC_API_KEY, OPENAI_API_KEY /
// OPENAI_BASE_URL and their *_BASE_URL), plus an optional JSON config file.
// The scripted route is registered unless --scripted=false.
//
//	DEEPSEEK_API_KEY=... llmgateway --listen 127.0.0.1:7701
//	grpcurl -plaintext -d '{"provider":"deepseek","model":"deepseek-v4-flash","messages":[{"role":"ROLE_USER","content":[{"text":{"text":"hi"}}]}]}' 127.0.0.1:7701 dsh.llm.v1.LlmGateway/Generate
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/buildinfo"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/debugserver"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/llmgateway"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if buildinfo.Requested(os.Args[1:]) {
		fmt.Println(buildinfo.String("llmgateway"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); errors.Is(err, flag.ErrHelp) {
		return
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "llmgateway:", err)
		os.Exit(1)
	}
}

// usage prints the flags and the environment variables that register the
// provider routes.
func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintln(w, "Usage: llmgateway [flags]\n\nServes dsh.llm.v1.LlmGateway. Flags:")
	fs.PrintDefaults()
	fmt.Fprintln(w, "\nEnvironment (provider routes; the scripted route is registered unless --scripted=false):")
	for _, v := range llmgateway.EnvVars() {
		fmt.Fprintf(w, "  %-21s %s\n", v.Name, v.Doc)
	}
}

// run serves until ctx ends. ready, when set, receives the listen address
// once the server accepts connections.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(addr string)) error {
	env := cmdline.NewEnv(getenv)
	cfg, cfgErr := llmgateway.ConfigFromEnv(getenv)
	fs := flag.NewFlagSet("llmgateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs) }
	fs.Bool("version", false, buildinfo.FlagUsage)
	listen := fs.String("listen", env.String("DSH_LISTEN", "127.0.0.1:7701"), "gRPC listen address (env DSH_LISTEN)")
	configFile := fs.String("config", env.String("DSH_LLM_CONFIG", ""), "optional JSON config file with extra routes and model catalogues (env DSH_LLM_CONFIG)")
	idle := fs.Duration("idle-timeout", cfg.IdleTimeout, "provider stream idle bound; 0 means 5m (env DSH_LLM_IDLE_TIMEOUT)")
	connAge := grpcserver.MaxConnectionAgeFlag(fs, env)
	prefixMiB := fs.Int64("prefix-cache-mib", env.Int64("DSH_LLM_PREFIX_CACHE_MIB", llmgateway.DefaultPrefixCacheBytes>>20), "MiB of remembered conversations (GenerateRequest.prefix: a step sends only its new messages); 0 remembers none (env DSH_LLM_PREFIX_CACHE_MIB)")
	prefixTenantMiB := fs.Int64("prefix-cache-tenant-mib", env.Int64("DSH_LLM_PREFIX_CACHE_TENANT_MIB", 0), "one tenant's share of --prefix-cache-mib; 0 means all of it (env DSH_LLM_PREFIX_CACHE_TENANT_MIB)")
	scriptedOn := fs.Bool("scripted", env.Bool("DSH_SCRIPTED", true), "serve the scripted route (the offline demo model); --scripted=false in production (env DSH_SCRIPTED=false)")
	var required requiredProviders
	fs.Var(&required, "require-provider", "a provider route that must be configured, repeatable or comma-separated (e.g. deepseek): without it the gateway refuses to start, so a missing key Secret fails the pod's readiness with a log line saying which (env DSH_REQUIRE_PROVIDER)")
	if v := getenv("DSH_REQUIRE_PROVIDER"); v != "" {
		_ = required.Set(v)
	}
	var srvFlags auth.ServerFlags
	srvFlags.RegisterFlags(fs, env)
	srvFlags.RegisterPeerFlag(fs, env)
	var dbg debugserver.Flags
	dbg.RegisterFlags(fs, env)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cmdline.NoArgs(fs); err != nil {
		return err
	}
	if err := errors.Join(cfgErr, env.Err()); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	srvOpts, err := srvFlags.ServerOptions(auth.Options{Listen: *listen, Logger: logger})
	if err != nil {
		return err
	}
	if *configFile != "" {
		if cfg, err = llmgateway.LoadConfigFile(*configFile, cfg, getenv); err != nil {
			return err
		}
	}
	if *idle > 0 {
		cfg.IdleTimeout = *idle
	}
	cfg.PrefixCacheBytes, cfg.PrefixCacheTenantBytes = *prefixMiB<<20, *prefixTenantMiB<<20
	if *prefixMiB <= 0 {
		cfg.PrefixCacheBytes = -1
	}
	if !*scriptedOn {
		cfg.Routes = slices.DeleteFunc(cfg.Routes, func(r llmgateway.RouteConfig) bool { return r.Kind == llmgateway.KindScripted })
	}
	if err := required.check(cfg); err != nil {
		logger.Error("refusing to start: a required provider is not configured", "err", err)
		return err
	}
	srvOpts = append(srvOpts, grpcserver.ConnectionAge(*connAge)...)
	cfg.Version = version

	dbgExp, err := dbg.Setup()
	if err != nil {
		return err
	}
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-llmgateway", ServiceVersion: version, Logger: logger, Getenv: getenv,
		ExtraMetricReaders: dbgExp.Readers()})
	if err != nil {
		return err
	}
	if _, err := dbgExp.Serve(ctx, dbg.Addr, logger); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()

	svc, err := llmgateway.New(cfg, logger)
	if err != nil {
		return err
	}
	defer svc.Close()
	srv := grpcserver.New(grpcserver.Config{Logger: logger, Options: append(append(llmgateway.ServerOptions(), srvOpts...), llmgateway.ChunkCounting(nil)),
		Tracing: grpcserver.TracingFor(tel.Tracing || tel.Metering)})
	svc.Register(srv.Server)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	logger.Info("llmgateway starting", "service", llmv1.LlmGateway_ServiceDesc.ServiceName, "addr", lis.Addr().String(), "routes", svc.RouteNames(), "version", version)
	if ready != nil {
		ready(lis.Addr().String())
	}
	return srv.Serve(ctx, lis)
}

// requiredProviders is --require-provider: route names that must be
// configured.
type requiredProviders []string

func (r *requiredProviders) String() string { return strings.Join(*r, ",") }

func (r *requiredProviders) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(*r, name) {
			*r = append(*r, name)
		}
	}
	return nil
}

// check names every required route cfg lacks, and the variable that would
// configure it.
func (r requiredProviders) check(cfg llmgateway.Config) error {
	var missing []string
	for _, name := range r {
		if !slices.ContainsFunc(cfg.Routes, func(rc llmgateway.RouteConfig) bool {
			return rc.Name == name && (rc.APIKey != "" || rc.Kind == llmgateway.KindScripted || (rc.Kind == llmgateway.KindOpenAI && rc.BaseURL != ""))
		}) {
			v := strings.ToUpper(name) + "_API_KEY"
			if name == "openai" {
				v = "OPENAI_API_KEY and/or OPENAI_BASE_URL" // a local server needs no key
			}
			missing = append(missing, fmt.Sprintf("%s (set %s, e.g. from the Secret dsh-provider-keys, or a config-file route)", name, v))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("--require-provider: not configured: %s", strings.Join(missing, "; "))
	}
	return nil
}
