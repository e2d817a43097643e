// Package natstest runs an embedded nats-server with JetStream enabled: in
// tests (Start, with its store in t.TempDir()) and in the all-in-one `dsh dev`
// (New, with its store in the data directory).
//
// A Server can be stopped and started again on the same port with the same
// store directory, which is how tests simulate a NATS outage.
package natstest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
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
	s := &Server{opts: server.Options{
		ServerName: "dsh-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoLog:      true,
		NoSigs:     true,
		// The embedded server is a single node on loopback; keep its HTTP
		// monitoring off.
		HTTPPort: 0,
	}}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Start starts a server whose store lives in t.TempDir() and shuts it down
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New(Options{StoreDir: t.TempDir()})
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
	if !ns.ReadyForConnections(readyTimeout) {
		ns.Shutdown()
		return fmt.Errorf("natstest: server on %s:%d not ready after %s", s.opts.Host, s.opts.Port, readyTimeout)
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
