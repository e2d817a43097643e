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
