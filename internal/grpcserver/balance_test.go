package grpcserver

import (
	"context"
	"flag"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
)

// connCounter counts the connections a server accepted.
type connCounter struct{ n atomic.Int64 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                       {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.n.Add(1)
	}
}

// TestConnectionAge: a server with a maximum connection age ends its
// clients' connections (GOAWAY) and the client opens a new one by itself
// (re-resolving: a new replica would now be dialed), with no call failing;
// without it one connection serves forever.
func TestConnectionAge(t *testing.T) {
	for _, tc := range []struct {
		age       time.Duration
		wantConns bool // more than one connection over the calls
	}{{100 * time.Millisecond, true}, {0, false}} {
		var cc connCounter
		srv := New(Config{Options: append(ConnectionAge(tc.age), grpc.StatsHandler(&cc))})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, lis) }()
		conn, err := Dial(lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		hc := healthpb.NewHealthClient(conn)
		// Calls for a while: until a second connection shows up (age set)
		// or for a second (age unset).
		for start := time.Now(); time.Since(start) < time.Second || (tc.wantConns && cc.n.Load() < 2 && time.Since(start) < 30*time.Second); {
			if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
				t.Fatalf("age %v: a call failed across the connection's end: %v", tc.age, err)
			}
			time.Sleep(10 * time.Millisecond) // pacing the calls, not synchronising
		}
		if got := cc.n.Load() > 1; got != tc.wantConns {
			t.Errorf("age %v: %d connections, want more than one: %v", tc.age, cc.n.Load(), tc.wantConns)
		}
		conn.Close()
		cancel()
		<-done
	}
}

func TestMaxConnectionAgeFlag(t *testing.T) {
	for _, tc := range []struct {
		env, arg string
		want     time.Duration
	}{{"", "", DefaultMaxConnectionAge}, {"1m", "", time.Minute}, {"1m", "--max-connection-age=0", 0}, {"bogus", "", DefaultMaxConnectionAge}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		got := MaxConnectionAgeFlag(fs, func(string) string { return tc.env })
		var args []string
		if tc.arg != "" {
			args = append(args, tc.arg)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if *got != tc.want {
			t.Errorf("env %q arg %q: %v, want %v", tc.env, tc.arg, *got, tc.want)
		}
	}
}
