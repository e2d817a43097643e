package auth

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/dsh-dev/dsh/internal/cmdline"
)

// Environment twins of the flags.
const (
	EnvTLSCert       = "DSH_TLS_CERT"
	EnvTLSKey        = "DSH_TLS_KEY"
	EnvTLSClientCA   = "DSH_TLS_CLIENT_CA"
	EnvTLSCA         = "DSH_TLS_CA"
	EnvTLSClientCert = "DSH_TLS_CLIENT_CERT"
	EnvTLSClientKey  = "DSH_TLS_CLIENT_KEY"
	EnvAllowPeer     = "DSH_ALLOW_PEER" // comma-separated
	EnvInsecure      = "DSH_INSECURE"
	EnvAuth          = "DSH_AUTH"
	EnvAuthTokens    = "DSH_AUTH_TOKENS"
	EnvJWKS          = "DSH_JWT_JWKS"
	EnvJWTIssuer     = "DSH_JWT_ISSUER"
	EnvJWTAudience   = "DSH_JWT_AUDIENCE"
	EnvJWTClockSkew  = "DSH_JWT_CLOCK_SKEW"
	EnvJWTTenant     = "DSH_JWT_TENANT_CLAIM"
	EnvJWTRoles      = "DSH_JWT_ROLES_CLAIM"
	EnvJWTRefresh    = "DSH_JWT_REFRESH"
	EnvToken         = "DSH_TOKEN"
)

// ServerFlags are the transport flags every dsh server takes.
type ServerFlags struct {
	TLS ServerTLS
	// AllowPeers are the client identities admitted (--allow-peer); only
	// servers that register RegisterPeerFlag have it.
	AllowPeers []string
	// Insecure allows a plaintext (or, on the agent, unauthenticated)
	// non-loopback listener.
	Insecure bool
}

// RegisterFlags adds --tls-cert, --tls-key, --tls-client-ca and --insecure
// to fs, with defaults from env (a malformed DSH_INSECURE is left in
// env.Err).
func (f *ServerFlags) RegisterFlags(fs *flag.FlagSet, env *cmdline.Env) {
	fs.StringVar(&f.TLS.Cert, "tls-cert", env.String(EnvTLSCert, ""), "PEM certificate this server presents; re-read when it changes (env "+EnvTLSCert+")")
	fs.StringVar(&f.TLS.Key, "tls-key", env.String(EnvTLSKey, ""), "PEM private key of --tls-cert (env "+EnvTLSKey+")")
	fs.StringVar(&f.TLS.ClientCA, "tls-client-ca", env.String(EnvTLSClientCA, ""), "PEM CA bundle; set: clients must present a certificate it signed (mTLS) (env "+EnvTLSClientCA+")")
	fs.BoolVar(&f.Insecure, "insecure", env.Bool(EnvInsecure, false), "allow listening on a non-loopback address without TLS (and, on the agent, without --auth) (env "+EnvInsecure+"=true)")
}

// RegisterPeerFlag adds --allow-peer (repeatable) to fs, with the
// identities of env's DSH_ALLOW_PEER.
func (f *ServerFlags) RegisterPeerFlag(fs *flag.FlagSet, env *cmdline.Env) {
	if v := env.String(EnvAllowPeer, ""); v != "" {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				f.AllowPeers = append(f.AllowPeers, p)
			}
		}
	}
	fs.Func("allow-peer", "client certificate identity admitted: URI SAN (spiffe://dsh/agent) or DNS SAN; repeatable; needs --tls-client-ca (env "+EnvAllowPeer+", comma-separated)", func(v string) error {
		f.AllowPeers = append(f.AllowPeers, v)
		return nil
	})
}

// Options are what a server needs beside its flags to build its options.
type Options struct {
	// Listen is the address the server binds (for the safe-default check).
	Listen string
	// Unauthenticated says the server authenticates no client (the agent
	// with --auth none): refused on a non-loopback address unless Insecure.
	Unauthenticated bool
	Logger          *slog.Logger
	Denials         DenialCounter
}

// ServerOptions checks the safe defaults for o.Listen and returns the
// gRPC server options of the flags: TLS credentials and the peer check.
func (f ServerFlags) ServerOptions(o Options) ([]grpc.ServerOption, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := CheckListen(o.Listen, !f.TLS.Enabled(), o.Unauthenticated, f.Insecure, o.Logger); err != nil {
		return nil, err
	}
	var opts []grpc.ServerOption
	if f.TLS.Enabled() {
		creds, err := ServerCredentials(f.TLS, o.Logger)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	if len(f.AllowPeers) > 0 {
		if !f.TLS.MutualTLS() {
			return nil, fmt.Errorf("--allow-peer needs --tls-client-ca (and --tls-cert/--tls-key): peers are identified by their client certificates")
		}
		p, err := NewPeers(f.AllowPeers, o.Logger, o.Denials)
		if err != nil {
			return nil, err
		}
		opts = append(opts, p.ServerOptions()...)
	}
	return opts, nil
}

// CheckListen enforces the safe defaults: a non-loopback listener must use
// TLS and (when the server authenticates clients) authentication, unless
// insecure is set, which only logs a warning. The refusal is one line
// naming --insecure.
func CheckListen(addr string, plaintext, unauthenticated, insecure bool, log *slog.Logger) error {
	if Loopback(addr) || (!plaintext && !unauthenticated) {
		return nil
	}
	var missing []string
	if plaintext {
		missing = append(missing, "without TLS (--tls-cert/--tls-key)")
	}
	if unauthenticated {
		missing = append(missing, "without client authentication (--auth token|jwt)")
	}
	what := strings.Join(missing, " and ")
	if !insecure {
		return fmt.Errorf("refusing to listen on non-loopback %s %s; configure it, or pass --insecure to run exposed anyway", addr, what)
	}
	if log != nil {
		log.Warn("INSECURE: listening on a non-loopback address "+what+" (--insecure)", "addr", addr)
	}
	return nil
}

// Loopback reports whether addr (host:port) binds only loopback
// interfaces. An empty host, a wildcard and any name but localhost are not
// loopback.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RegisterFlags adds --tls-ca, --tls-client-cert and --tls-client-key to fs,
// with defaults from getenv (nil: os.Getenv).
func (c *ClientTLS) RegisterFlags(fs *flag.FlagSet, getenv func(string) string) {
	if getenv == nil {
		getenv = os.Getenv
	}
	fs.StringVar(&c.CA, "tls-ca", getenv(EnvTLSCA), "PEM CA bundle to verify the servers this process dials; set (or a client certificate set): dial with TLS (env "+EnvTLSCA+")")
	fs.StringVar(&c.Cert, "tls-client-cert", getenv(EnvTLSClientCert), "PEM client certificate presented to servers (mTLS); re-read when it changes (env "+EnvTLSClientCert+")")
	fs.StringVar(&c.Key, "tls-client-key", getenv(EnvTLSClientKey), "PEM private key of --tls-client-cert (env "+EnvTLSClientKey+")")
}

// Credentials returns the client transport credentials, or nil when TLS is
// not configured (plaintext).
func (c ClientTLS) Credentials(log *slog.Logger) (credentials.TransportCredentials, error) {
	if !c.Enabled() {
		return nil, nil
	}
	return ClientCredentials(c, log)
}

// AuthFlags are the agent's client-authentication flags.
type AuthFlags struct {
	// Mode is none, token or jwt.
	Mode       string
	TokensFile string
	JWT        JWTConfig
}

// RegisterFlags adds --auth, --auth-tokens and the --jwt-* flags to fs,
// with defaults from env (a malformed duration is left in env.Err).
func (a *AuthFlags) RegisterFlags(fs *flag.FlagSet, env *cmdline.Env) {
	fs.StringVar(&a.Mode, "auth", env.String(EnvAuth, "none"), "client authentication: none (local use: tenant default, every role), token or jwt (env "+EnvAuth+")")
	fs.StringVar(&a.TokensFile, "auth-tokens", env.String(EnvAuthTokens, ""), "--auth token: file of `sha256:<hex> <tenant> <subject> <role,role>` lines (env "+EnvAuthTokens+")")
	fs.StringVar(&a.JWT.JWKS, "jwt-jwks", env.String(EnvJWKS, ""), "--auth jwt: JWKS file or https:// URL, refreshed (env "+EnvJWKS+")")
	fs.StringVar(&a.JWT.Issuer, "jwt-issuer", env.String(EnvJWTIssuer, ""), "--auth jwt: required iss (env "+EnvJWTIssuer+")")
	fs.StringVar(&a.JWT.Audience, "jwt-audience", env.String(EnvJWTAudience, ""), "--auth jwt: required aud (env "+EnvJWTAudience+")")
	fs.DurationVar(&a.JWT.ClockSkew, "jwt-clock-skew", env.Duration(EnvJWTClockSkew, time.Minute), "--auth jwt: leeway on exp/nbf/iat (env "+EnvJWTClockSkew+")")
	fs.StringVar(&a.JWT.TenantClaim, "jwt-tenant-claim", env.String(EnvJWTTenant, "tenant"), "--auth jwt: claim naming the tenant (env "+EnvJWTTenant+")")
	fs.StringVar(&a.JWT.RolesClaim, "jwt-roles-claim", env.String(EnvJWTRoles, "roles"), "--auth jwt: claim listing the roles (env "+EnvJWTRoles+")")
	fs.DurationVar(&a.JWT.Refresh, "jwt-jwks-refresh", env.Duration(EnvJWTRefresh, 5*time.Minute), "--auth jwt: how often the JWKS is re-read (env "+EnvJWTRefresh+")")
}

// Unauthenticated reports whether the mode authenticates nobody.
func (a AuthFlags) Unauthenticated() bool { return a.Mode == "" || a.Mode == "none" }

// Authenticator builds the authenticator of the mode; close releases it
// (stops the JWKS refresher).
func (a AuthFlags) Authenticator(ctx context.Context, log *slog.Logger) (authn Authenticator, close func(), err error) {
	switch a.Mode {
	case "", "none":
		return None{}, func() {}, nil
	case "token":
		if a.TokensFile == "" {
			return nil, nil, fmt.Errorf("--auth token needs --auth-tokens FILE")
		}
		t, err := LoadTokens(a.TokensFile)
		if err != nil {
			return nil, nil, err
		}
		if log != nil {
			log.Info("token authentication", "file", a.TokensFile, "tokens", t.Len())
		}
		return t, func() {}, nil
	case "jwt":
		cfg := a.JWT
		cfg.Logger = log
		j, err := NewJWT(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return j, j.Close, nil
	}
	return nil, nil, fmt.Errorf("--auth %q: use none, token or jwt", a.Mode)
}
