package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerTLS names the PEM files of a server's TLS identity. The zero value
// means plaintext. With ClientCA set, client certificates are required and
// verified against it (mTLS).
type ServerTLS struct {
	Cert, Key, ClientCA string
}

// Enabled reports whether any TLS file is configured.
func (c ServerTLS) Enabled() bool { return c.Cert != "" || c.Key != "" || c.ClientCA != "" }

// MutualTLS reports whether client certificates are required.
func (c ServerTLS) MutualTLS() bool { return c.ClientCA != "" }

// ClientTLS names the PEM files a client uses: CA to verify the server
// (empty: the system roots) and, for mTLS, its own certificate and key. The
// zero value means plaintext.
type ClientTLS struct {
	CA, Cert, Key string
	// ServerName overrides the name verified in the server's certificate
	// (default: the host of the dialed address).
	ServerName string
}

// Enabled reports whether any TLS file is configured.
func (c ClientTLS) Enabled() bool { return c.CA != "" || c.Cert != "" || c.Key != "" }

// ServerCredentials returns gRPC transport credentials serving c, reloading
// the files when they change. It fails when the files do not load now (a
// server must not start with a broken identity).
func ServerCredentials(c ServerTLS, log *slog.Logger) (credentials.TransportCredentials, error) {
	if c.Cert == "" || c.Key == "" {
		return nil, fmt.Errorf("TLS needs both --tls-cert and --tls-key (got cert %q, key %q)", c.Cert, c.Key)
	}
	r, err := newReloader([]string{c.Cert, c.Key, c.ClientCA}, func() (*tls.Config, error) {
		return loadServerConfig(c)
	}, log)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.current(), nil
		},
	}), nil
}

func loadServerConfig(c ServerTLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert %s / --tls-key %s: %w", c.Cert, c.Key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if c.ClientCA != "" {
		pool, err := loadPool(c.ClientCA, "--tls-client-ca")
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientCredentials returns gRPC transport credentials for c, reloading the
// files when they change.
func ClientCredentials(c ClientTLS, log *slog.Logger) (credentials.TransportCredentials, error) {
	if (c.Cert == "") != (c.Key == "") {
		return nil, fmt.Errorf("a client certificate needs both --tls-client-cert and --tls-client-key (got cert %q, key %q)", c.Cert, c.Key)
	}
	r, err := newReloader([]string{c.CA, c.Cert, c.Key}, func() (*tls.Config, error) {
		return loadClientConfig(c)
	}, log)
	if err != nil {
		return nil, err
	}
	return &clientCreds{r: r, serverName: c.ServerName}, nil
}

func loadClientConfig(c ClientTLS) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pool, err := loadPool(c.CA, "--tls-ca")
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.Cert != "" {
		cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("load --tls-client-cert %s / --tls-client-key %s: %w", c.Cert, c.Key, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadPool(path, flag string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", flag, path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", flag, path)
	}
	return pool, nil
}

// clientCreds hands each handshake to TLS credentials built from the
// current files, so a rotated CA bundle or client certificate is used by the
// next connection.
type clientCreds struct {
	r          *reloader
	serverName string

	mu    sync.Mutex
	base  *tls.Config
	creds credentials.TransportCredentials
}

func (c *clientCreds) tc() credentials.TransportCredentials {
	cfg := c.r.current()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cfg != c.base {
		withName := cfg.Clone()
		if c.serverName != "" {
			withName.ServerName = c.serverName
		}
		c.base, c.creds = cfg, credentials.NewTLS(withName)
	}
	return c.creds
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.tc().ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("auth: client credentials cannot serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo { return c.tc().Info() }

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{r: c.r, serverName: c.serverName}
}

// OverrideServerName is deprecated in gRPC; ClientTLS.ServerName does this.
func (c *clientCreds) OverrideServerName(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.serverName, c.base = name, nil
	return nil
}

// reloader holds a *tls.Config built from files and rebuilds it when one of
// the files changes (modification time or size).
type reloader struct {
	files []string
	build func() (*tls.Config, error)
	log   *slog.Logger

	mu     sync.Mutex
	stamps []stamp
	cfg    *tls.Config
	failed []stamp // the file states that last failed to load
}

type stamp struct {
	mod  time.Time
	size int64
}

func newReloader(files []string, build func() (*tls.Config, error), log *slog.Logger) (*reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &reloader{build: build, log: log}
	for _, f := range files {
		if f != "" {
			r.files = append(r.files, f)
		}
	}
	r.stamps = r.stat()
	cfg, err := build()
	if err != nil {
		return nil, err
	}
	r.cfg = cfg
	return r, nil
}

func (r *reloader) stat() []stamp {
	out := make([]stamp, len(r.files))
	for i, f := range r.files {
		if fi, err := os.Stat(f); err == nil {
			out[i] = stamp{mod: fi.ModTime(), size: fi.Size()}
		}
	}
	return out
}

// current returns the configuration of the files as they are now, rebuilding
// it when they changed; a rebuild that fails keeps the previous one.
func (r *reloader) current() *tls.Config {
	now := r.stat()
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Equal(now, r.stamps) || slices.Equal(now, r.failed) {
		return r.cfg
	}
	cfg, err := r.build()
	if err != nil {
		// Logged once per state of the files; retried when they change.
		r.failed = now
		r.log.Warn("TLS files changed but do not load; keeping the previous certificates", "files", r.files, "err", err)
		return r.cfg
	}
	r.failed = nil
	r.stamps, r.cfg = now, cfg
	r.log.Info("TLS certificates reloaded", "files", r.files)
	return cfg
}
