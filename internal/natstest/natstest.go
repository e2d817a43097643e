// Package natstest runs an embedded nats-server with JetStream enabled: in
// tests (Start, with its store in t.TempDir()) and in the all-in-one `dsh dev`
// (New, with its store in the data directory).
//
// Options.Config takes a nats-server configuration (accounts, users, nkeys,
// permissions, TLS) in the server's own file format, so security tests run
// against a real server configured the way a deployment configures it.
//
// A Server can be stopped and started again on the same port with the same
// store directory, which is how tests simulate a NATS outage.
package natstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds how long Start waits for the server to accept clients.
const readyTimeout = 10 * time.Second

// Options configures an embedded server.
type Options struct {
	// Host to listen on; empty means 127.0.0.1.
	Host string
	// Port to listen on; 0 lets the OS choose.
	Port int
	// StoreDir holds the JetStream store. Required.
	StoreDir string
	// Config is nats-server configuration text (the server's file format:
	// accounts, authorization, tls, ...). Listen address, store, JetStream,
	// logging and signals are set by Options regardless of it.
	Config string
}

// Server is an embedded NATS server with JetStream.
type Server struct {
	mu   sync.Mutex
	opts server.Options
	ns   *server.Server
}

// New starts an embedded server and waits until it accepts connections.
func New(o Options) (*Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("natstest: StoreDir is required")
	}
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := o.Port
	if port == 0 {
		port = -1 // nats-server: random port
	}
	base := &server.Options{}
	if o.Config != "" {
		f := filepath.Join(o.StoreDir, "nats-server.conf")
		if err := os.WriteFile(f, []byte(o.Config), 0o600); err != nil {
			return nil, fmt.Errorf("natstest: %w", err)
		}
		var err error
		if base, err = server.ProcessConfigFile(f); err != nil {
			return nil, fmt.Errorf("natstest: config: %w", err)
		}
	}
	base.ServerName = "dsh-embedded"
	base.Host, base.Port = host, port
	base.JetStream, base.StoreDir = true, o.StoreDir
	base.NoLog, base.NoSigs = true, true
	// The embedded server is a single node on loopback; keep its HTTP
	// monitoring off.
	base.HTTPPort = 0
	s := &Server{opts: *base}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Permissions formats a user's permissions block for Options.Config: the
// subjects it may publish to and subscribe to, nothing else.
func Permissions(publish, subscribe []string) string {
	return fmt.Sprintf("{ publish: { allow: %s }, subscribe: { allow: %s } }", quoteList(publish), quoteList(subscribe))
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// Start starts a server whose store lives in t.TempDir() and shuts it down
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options; an empty StoreDir means t.TempDir().
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	s, err := New(o)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

func (s *Server) start() error {
	opts := s.opts // copy: nats-server keeps a pointer and mutates it
	ns, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("natstest: new server: %w", err)
	}
	go ns.Start()
	// ReadyForConnections(readyTimeout) checks every 25 ms: a server up
	// after 3 ms was reported after 25 or 50, which `dsh dev -p` (NATS
	// started as the model answers, the run over tens of milliseconds
	// later) waited for at its exit. Check every millisecond instead, each
	// check a brief one (nats-server does not sleep below 25 ms).
	for deadline := time.Now().Add(readyTimeout); !ns.ReadyForConnections(100 * time.Microsecond); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			ns.Shutdown()
			return fmt.Errorf("natstest: server on %s:%d not ready after %s", s.opts.Host, s.opts.Port, readyTimeout)
		}
	}
	// Pin the chosen port so a restart comes back on the same address.
	if addr, ok := ns.Addr().(*net.TCPAddr); ok {
		s.opts.Port = addr.Port
	}
	s.ns = ns
	return nil
}

// URL is the client URL, nats://host:port.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "nats://" + net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

// StoreDir is the JetStream store directory.
func (s *Server) StoreDir() string { return s.opts.StoreDir }

// Running reports whether the server is started.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns != nil
}

// Clients returns the number of client connections the server holds now
// and how many it has accepted since it started (0, 0 when stopped).
func (s *Server) Clients() (open int, total uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns == nil {
		return 0, 0
	}
	v, err := s.ns.Varz(nil)
	if err != nil {
		return 0, 0
	}
	return v.Connections, v.TotalConnections
}

// Stop shuts the server down and waits until it has stopped; the store is
// kept, so Restart brings the same streams back.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns == nil {
		return
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.ns = nil
}

// Restart starts a stopped server again on the same port and store.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns != nil {
		return nil
	}
	var err error
	// The port may linger briefly after a shutdown; retry for a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err = s.start(); err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Shutdown stops the server; it is safe to call more than once.
func (s *Server) Shutdown() { s.Stop() }
