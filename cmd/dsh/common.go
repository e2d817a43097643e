package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/agent"
)

// Default addresses, shared with the services' own defaults.
const (
	defaultAgentAddr    = "127.0.0.1:7700"
	defaultGatewayAddr  = "127.0.0.1:7701"
	defaultToolhostAddr = "127.0.0.1:7702"
	defaultNATSURL      = "nats://127.0.0.1:4222"
)

func envOr(e *env, key, def string) string {
	if v := e.getenv(key); v != "" {
		return v
	}
	return def
}

// newFlags returns a flag set whose usage names the subcommand.
func newFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: dsh %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags anywhere among the arguments (`dsh sessions events ID
// --addr X` honours --addr); after "--" everything is positional. fs.Args()
// then holds the positional arguments in order. --help exits 0 after
// printing usage.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return &exitError{code: 0}
			}
			return &exitError{code: 2}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Leave the positionals in fs.Args(); "--" keeps them from being
	// parsed as flags a second time.
	return fs.Parse(append([]string{"--"}, pos...))
}

// isTTY reports whether v (a reader or a writer) is a terminal.
func isTTY(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// useColor: colour only on a TTY, never with NO_COLOR or TERM=dumb.
func useColor(e *env, w io.Writer) bool {
	if _, set := lookupEnv(e, "NO_COLOR"); set {
		return false
	}
	if e.getenv("TERM") == "dumb" {
		return false
	}
	return isTTY(w)
}

func lookupEnv(e *env, k string) (string, bool) {
	if e.getenv == nil {
		return "", false
	}
	if v := e.getenv(k); v != "" {
		return v, true
	}
	return "", false
}

// clientFlags are the transport and credential flags of every client
// subcommand.
type clientFlags struct {
	tls   auth.ClientTLS
	token string
}

// registerClientFlags adds --tls-ca, --tls-client-cert, --tls-client-key
// and --token to fs.
func registerClientFlags(e *env, fs *flag.FlagSet) *clientFlags {
	cf := &clientFlags{}
	cf.tls.RegisterFlags(fs, e.getenv)
	fs.StringVar(&cf.token, "token", e.getenv(auth.EnvToken), "bearer token sent to the agent as `authorization: Bearer` (env "+auth.EnvToken+")")
	return cf
}

// dialOptions are the credentials of cf for addr: TLS when configured, and
// the bearer token (over plaintext only to a loopback address).
func (cf *clientFlags) dialOptions(addr string) ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	creds, err := cf.tls.Credentials(nil)
	if err != nil {
		return nil, err
	}
	if creds != nil {
		opts = append(opts, grpcserver.WithCredentials(grpc.WithTransportCredentials(creds)))
	}
	if cf.token != "" {
		if creds == nil && !auth.Loopback(addr) {
			return nil, fmt.Errorf("refusing to send --token in plaintext to %s: set --tls-ca (or DSH_TLS_CA) to dial with TLS", addr)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(auth.Bearer(cf.token, creds != nil)))
	}
	return opts, nil
}

// dialService connects to addr and checks, within a short deadline, that a
// server answering the health service is there. what names the service for
// the error line ("agent service").
func dialService(ctx context.Context, addr, what string, cf *clientFlags) (*grpc.ClientConn, error) {
	opts, err := cf.dialOptions(addr)
	if err != nil {
		return nil, &exitError{code: 2, msg: err.Error()}
	}
	// Lost replies are retried; every command carries a request_id.
	opts = append(opts, grpc.WithDefaultServiceConfig(agent.ClientServiceConfig))
	conn, err := grpcserver.Dial(addr, opts...)
	if err != nil {
		return nil, &exitError{code: 1, msg: fmt.Sprintf("%s address %q: %v", what, addr, err)}
	}
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false)); err != nil {
		conn.Close()
		return nil, &exitError{code: 1, msg: fmt.Sprintf("no %s at %s (is `dsh dev` running? use --addr to point elsewhere)", what, addr)}
	}
	return conn, nil
}

// requestID is a fresh idempotency key for one command (its retries reuse
// it: docs/API.md "Retries and request_id").
func requestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// table prints rows aligned in columns.
func table(w io.Writer, header []string, rows [][]string) {
	widths := make([]int, len(header))
	for i, h := range header {
		widths[i] = len(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i == len(cells)-1 {
				b.WriteString(c)
				break
			}
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", widths[i]-len([]rune(c))+2))
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
}
