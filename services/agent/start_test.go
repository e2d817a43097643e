package agent_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestGatewayConnectedAtStart: the agent's gateway channel (ring_hash,
// which dials only when a call picks a replica) is connected while the
// agent starts, not by the first session's ListProviders on the way to its
// first model request.
func TestGatewayConnectedAtStart(t *testing.T) {
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
		done <- agent.Run(ctx, agent.ServerConfig{Listener: lis, Gateway: gw.Addr().String(), ConnectGatewayAtStart: true, Store: "jsonl", DataDir: t.TempDir()}, nil)
	}()
	select {
	case c := <-accepted:
		c.Close()
	case err := <-done:
		t.Fatalf("Run ended before dialling the gateway: %v", err)
	case <-time.After(10 * time.Second):
		t.Error("no connection to the gateway 10 s into the agent's start, with no session asking")
	}
	cancel()
	if err := <-done; err != nil {
		t.Logf("Run: %v", err)
	}
}
