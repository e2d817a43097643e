package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/services/agent"
)

// TestStoreErrorEndsTheToolhostListing: the store opens while the toolhosts
// are listed; a store that fails to open is the error Run returns, at once,
// not after a toolhost that never answers has used up its listing's 5 s
// start timeout.
func TestStoreErrorEndsTheToolhostListing(t *testing.T) {
	t.Parallel()
	// A peer that accepts connections and never says a word.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	start := time.Now()
	err = agent.Run(context.Background(), agent.ServerConfig{Listener: lis, Gateway: silent.Addr().String(),
		Toolhosts: []string{"silent=" + silent.Addr().String()}, Store: "nosuch", DataDir: t.TempDir()}, nil)
	if err == nil || !strings.Contains(err.Error(), `unknown store "nosuch"`) {
		t.Fatalf("Run = %v, want the store's error", err)
	}
	if d := time.Since(start); d >= 4*time.Second {
		t.Errorf("Run returned after %v: it waited for the silent toolhost's listing", d)
	}
}

// TestHealthListenBusyFailsFirst: a --health-listen port already taken fails
// the start before anything is started: the server never accepts a call
// (calls held at the start gate would run as soon as it opened, and the
// failed start would then pull the store from under them) and the store is
// never opened.
func TestHealthListenBusyFailsFirst(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	dir := t.TempDir()
	var accepting, ready bool
	err = agent.Run(t.Context(), agent.ServerConfig{Listener: lis, Gateway: busy.Addr().String(), Store: "sqlite", DataDir: dir,
		HealthListen: busy.Addr().String(), Accepting: func(string) { accepting = true }, Ready: func(string) { ready = true }}, nil)
	if err == nil || !strings.Contains(err.Error(), "health listen "+busy.Addr().String()) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Run = %v, want the health listener's bind error", err)
	}
	if accepting || ready {
		t.Errorf("the server accepted calls (Accepting called: %v, Ready called: %v) before the health listener failed", accepting, ready)
	}
	if _, err := os.Stat(filepath.Join(dir, "sessions.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the store was opened before the health listener failed: stat sessions.db = %v", err)
	}
}

// TestFailedStartClosesThePublisher: a start that fails after the NATS
// publisher connected (here the service's construction: a deployment
// approval rule without a tool) closes the publisher and the health
// listener it bound first: no NATS connection and no port outlives Run.
func TestFailedStartClosesThePublisher(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	healthAddr := proctest.FreeAddr(t)
	err = agent.Run(t.Context(), agent.ServerConfig{Listener: lis, Gateway: lis.Addr().String(), Store: "jsonl", DataDir: t.TempDir(), NoTitles: true,
		HealthListen: healthAddr, NATS: events.Conn{URL: ns.URL()}, Service: agent.Config{Approval: agent.ApprovalConfig{Rules: []*sessionv1.ApprovalRule{{Action: sessionv1.RuleAction_RULE_ACTION_ALLOW}}}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "needs a tool name") {
		t.Fatalf("Run = %v, want the approval rule's error", err)
	}
	if _, total := ns.Clients(); total == 0 {
		t.Fatal("the publisher never connected to NATS: the start failed before it")
	}
	// The health port it bound first is free again.
	if l, err := net.Listen("tcp", healthAddr); err != nil {
		t.Fatalf("the health port is still held after a failed start: %v", err)
	} else {
		l.Close()
	}
	// The server notices a closed connection on its own goroutine.
	deadline := time.Now().Add(10 * time.Second)
	for {
		open, _ := ns.Clients()
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d NATS connections still open 10 s after Run returned", open)
		}
		time.Sleep(10 * time.Millisecond) // polling another server's state
	}
}

// TestGatewayConnectedAtStart: the agent's gateway channel (ring_hash,
// which dials only when a call picks a replica) is connected while the
// agent starts when asked (dsh dev), not by the first session's
// ListProviders on the way to its first model request; a standalone agent
// (not asked) leaves it idle, so a gateway down at its start does not put
// the channel into reconnect backoff.
func TestGatewayConnectedAtStart(t *testing.T) {
	t.Parallel()
	for _, connect := range []bool{true, false} {
		t.Run(fmt.Sprintf("connect=%v", connect), func(t *testing.T) {
			t.Parallel()
			gw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := gw.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}()
			t.Cleanup(func() { gw.Close() })
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- agent.Run(ctx, agent.ServerConfig{Listener: lis, Gateway: gw.Addr().String(), ConnectGatewayAtStart: connect, Store: "jsonl", DataDir: t.TempDir()}, nil)
			}()
			wait := 10 * time.Second
			if !connect {
				// Serving first, then a while longer with no session.
				conn, err := grpcserver.Dial(lis.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				sctx, endWait := context.WithTimeout(t.Context(), 20*time.Second)
				defer endWait()
				proctest.WaitServing(sctx, t, conn, "")
				wait = 300 * time.Millisecond
			}
			select {
			case c := <-accepted:
				c.Close()
				if !connect {
					t.Error("a standalone agent dialled its gateway at start, with no session asking")
				}
			case err := <-done:
				t.Fatalf("Run ended before the check: %v", err)
			case <-time.After(wait):
				if connect {
					t.Error("no connection to the gateway 10 s into the agent's start, with no session asking")
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Logf("Run: %v", err)
			}
		})
	}
}
