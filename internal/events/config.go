package events

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Flag names shared by every binary that connects to NATS, with the
// environment variables that give their defaults.
const (
	FlagURL     = "nats"
	FlagCreds   = "nats-creds"
	FlagNKey    = "nats-nkey"
	FlagTLSCA   = "nats-tls-ca"
	FlagTLSCert = "nats-tls-cert"
	FlagTLSKey  = "nats-tls-key"
	FlagUser    = "nats-user"
	FlagInbox   = "nats-inbox-prefix"
	EnvURL      = "NATS_URL"
	EnvCreds    = "NATS_CREDS"
	EnvNKey     = "NATS_NKEY"
	EnvTLSCA    = "NATS_CA"
	EnvTLSCert  = "NATS_CERT"
	EnvTLSKey   = "NATS_KEY"
	EnvUser     = "NATS_USER"
	EnvInbox    = "NATS_INBOX_PREFIX"
	// EnvPassword and EnvPasswordAlt give the password of --nats-user. There
	// is no password flag: a flag value is visible to everyone in ps.
	EnvPassword    = "DSH_NATS_PASSWORD"
	EnvPasswordAlt = "NATS_PASSWORD"
)

// Conn holds the connection options: the URL (or comma-separated URLs) and
// the credentials and TLS files NATS users expect.
type Conn struct {
	// URL is one or more comma-separated server URLs (nats://, tls://,
	// ws://, wss://). Required.
	URL string
	// CredsFile is a .creds file (user JWT and nkey seed).
	CredsFile string
	// NKeySeedFile is a file holding a user nkey seed.
	NKeySeedFile string
	// TLSCAFile is a PEM bundle of CAs to trust.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a PEM client certificate and its key.
	TLSCertFile, TLSKeyFile string
	// User and Password authenticate with a user name and password. The
	// password comes only from the environment (EnvPassword, else
	// EnvPasswordAlt).
	User, Password string
	// InboxPrefix replaces _INBOX as the prefix of reply subjects, so NATS
	// permissions can give each consumer its own inboxes
	// (TenantInboxPrefix).
	InboxPrefix string
	// Name is the connection name shown by the server's monitoring.
	Name string
}

// RegisterFlags adds the connection flags to fs, with defaults from getenv
// (nil means os.Getenv).
func (c *Conn) RegisterFlags(fs *flag.FlagSet, getenv func(string) string) {
	if getenv == nil {
		getenv = os.Getenv
	}
	fs.StringVar(&c.URL, FlagURL, getenv(EnvURL), "NATS server URL(s), comma-separated (env "+EnvURL+")")
	fs.StringVar(&c.CredsFile, FlagCreds, getenv(EnvCreds), "NATS user credentials file (env "+EnvCreds+")")
	fs.StringVar(&c.NKeySeedFile, FlagNKey, getenv(EnvNKey), "NATS nkey seed file (env "+EnvNKey+")")
	fs.StringVar(&c.TLSCAFile, FlagTLSCA, getenv(EnvTLSCA), "PEM CA bundle to verify the NATS server (env "+EnvTLSCA+")")
	fs.StringVar(&c.TLSCertFile, FlagTLSCert, getenv(EnvTLSCert), "PEM client certificate for NATS (env "+EnvTLSCert+")")
	fs.StringVar(&c.TLSKeyFile, FlagTLSKey, getenv(EnvTLSKey), "PEM client key for NATS (env "+EnvTLSKey+")")
	fs.StringVar(&c.User, FlagUser, getenv(EnvUser), "NATS user name; the password comes from env "+EnvPassword+" or "+EnvPasswordAlt+" (env "+EnvUser+")")
	fs.StringVar(&c.InboxPrefix, FlagInbox, getenv(EnvInbox), "prefix of NATS reply inboxes instead of _INBOX (env "+EnvInbox+")")
	c.Password = getenv(EnvPassword)
	if c.Password == "" {
		c.Password = getenv(EnvPasswordAlt)
	}
}

// OptionError is a connection option that cannot work; it names the flag.
type OptionError struct {
	// Flag is the flag name, for example "nats-creds".
	Flag string
	// Value is the offending value.
	Value string
	// Err says what is wrong.
	Err error
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("--%s %q: %v", e.Flag, e.Value, e.Err)
}

func (e *OptionError) Unwrap() error { return e.Err }

// Code is the stable error code.
func (e *OptionError) Code() string { return "NATS_BAD_OPTION" }

// Options validates c and returns the nats.Options for it, without any
// reconnect policy. Every problem that can be found without contacting the
// server (URL scheme, unreadable or malformed credentials, TLS files) is an
// *OptionError naming the flag.
func (c *Conn) Options() ([]nats.Option, error) {
	if strings.TrimSpace(c.URL) == "" {
		return nil, &OptionError{Flag: FlagURL, Value: c.URL, Err: errors.New("no NATS URL given")}
	}
	for _, u := range strings.Split(c.URL, ",") {
		u = strings.TrimSpace(u)
		pu, err := url.Parse(u)
		if err != nil {
			return nil, &OptionError{Flag: FlagURL, Value: u, Err: err}
		}
		switch pu.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return nil, &OptionError{Flag: FlagURL, Value: u, Err: fmt.Errorf("scheme %q is not nats://, tls://, ws:// or wss://", pu.Scheme)}
		}
		if pu.Host == "" {
			return nil, &OptionError{Flag: FlagURL, Value: u, Err: errors.New("no host")}
		}
	}
	var opts []nats.Option
	if c.Name != "" {
		opts = append(opts, nats.Name(c.Name))
	}
	if c.CredsFile != "" && c.NKeySeedFile != "" {
		return nil, &OptionError{Flag: FlagNKey, Value: c.NKeySeedFile, Err: errors.New("give either --" + FlagCreds + " or --" + FlagNKey + ", not both")}
	}
	if c.User != "" || c.Password != "" {
		o, err := c.userOption()
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	if c.InboxPrefix != "" {
		if strings.ContainsAny(c.InboxPrefix, " \t\r\n*>") || strings.HasPrefix(c.InboxPrefix, ".") || strings.HasSuffix(c.InboxPrefix, ".") {
			return nil, &OptionError{Flag: FlagInbox, Value: c.InboxPrefix, Err: errors.New("not a subject prefix (no spaces, wildcards or leading/trailing dot)")}
		}
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	if c.CredsFile != "" {
		b, err := os.ReadFile(c.CredsFile)
		if err != nil {
			return nil, &OptionError{Flag: FlagCreds, Value: c.CredsFile, Err: err}
		}
		if _, err := nkeys.ParseDecoratedJWT(b); err != nil {
			return nil, &OptionError{Flag: FlagCreds, Value: c.CredsFile, Err: fmt.Errorf("no user JWT: %w", err)}
		}
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			return nil, &OptionError{Flag: FlagCreds, Value: c.CredsFile, Err: fmt.Errorf("no nkey seed: %w", err)}
		}
		kp.Wipe()
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NKeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, &OptionError{Flag: FlagNKey, Value: c.NKeySeedFile, Err: err}
		}
		opts = append(opts, o)
	}
	if c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSKeyFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, &OptionError{Flag: FlagTLSCA, Value: c.TLSCAFile, Err: err}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, &OptionError{Flag: FlagTLSCA, Value: c.TLSCAFile, Err: errors.New("no PEM certificates in file")}
			}
			tc.RootCAs = pool
		}
		if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
			return nil, &OptionError{Flag: FlagTLSCert, Value: c.TLSCertFile, Err: errors.New("--" + FlagTLSCert + " and --" + FlagTLSKey + " go together")}
		}
		if c.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return nil, &OptionError{Flag: FlagTLSCert, Value: c.TLSCertFile, Err: err}
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// userOption is the user/password option; the password never appears in an
// error.
func (c *Conn) userOption() (nats.Option, error) {
	switch {
	case c.User == "":
		return nil, &OptionError{Flag: FlagUser, Value: "", Err: errors.New("a NATS password is set in the environment (" + EnvPassword + " or " + EnvPasswordAlt + ") but no --" + FlagUser)}
	case c.Password == "":
		return nil, &OptionError{Flag: FlagUser, Value: c.User, Err: errors.New("no password: set " + EnvPassword + " (or " + EnvPasswordAlt + ") in the environment")}
	case c.CredsFile != "" || c.NKeySeedFile != "":
		return nil, &OptionError{Flag: FlagUser, Value: c.User, Err: errors.New("give one of --" + FlagCreds + ", --" + FlagNKey + " or --" + FlagUser + ", not several")}
	}
	return nats.UserInfo(c.User, c.Password), nil
}
