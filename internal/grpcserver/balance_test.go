package grpcserver

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/stats"

	"github.com/dsh-dev/dsh/internal/cmdline"
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
		addr, ctx, cancel, done := serveLocal(t, srv)
		conn, err := Dial(addr)
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

// TestMaxConnectionAgeFlag: the flag wins over DSH_MAX_CONNECTION_AGE; a
// variable that is not a duration is an error naming it, flag or not.
func TestMaxConnectionAgeFlag(t *testing.T) {
	for _, tc := range []struct {
		env, arg string
		want     time.Duration
		wantErr  string
	}{
		{"", "", DefaultMaxConnectionAge, ""},
		{"1m", "", time.Minute, ""},
		{"90", "", 90 * time.Second, ""},
		{"1m", "--max-connection-age=0", 0, ""},
		{"bogus", "", DefaultMaxConnectionAge, `DSH_MAX_CONNECTION_AGE="bogus": not a duration`},
		{"bogus", "--max-connection-age=1m", time.Minute, `DSH_MAX_CONNECTION_AGE="bogus": not a duration`},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		env := cmdline.NewEnv(func(string) string { return tc.env })
		got := MaxConnectionAgeFlag(fs, env)
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
		if err := env.Err(); (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("env %q arg %q: error %v, want %q", tc.env, tc.arg, err, tc.wantErr)
		}
	}
}

// TestSessionAffinity: a connection dialled with SessionAffinity sends every
// call carrying the same header value to one replica of the three its name
// resolves to, and different values to different replicas. Its replicas are
// connected lazily, so the first calls find them IDLE: they are fail-fast
// calls (no WaitForReady) and must still succeed (the balancer queues them
// while the replica connects). A call without the header goes anywhere. A
// replica that stops hands its values to the others, again without a call
// failing.
func TestSessionAffinity(t *testing.T) {
	const replicas, keys, calls, header = 3, 12, 3, "dsh-session-id"
	var (
		mu     sync.Mutex
		served = map[string]map[int]int{} // key -> replica -> calls
		stops  []func()                   // each stops its replica once, waiting for it
		addrs  []resolver.Address
	)
	for i := range replicas {
		record := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			key := strings.Join(md.Get(header), ",")
			mu.Lock()
			if served[key] == nil {
				served[key] = map[int]int{}
			}
			served[key][i]++
			mu.Unlock()
			return h(ctx, req)
		})
		srv := New(Config{Options: []grpc.ServerOption{record}})
		addr, _, cancel, done := serveLocal(t, srv)
		stops = append(stops, sync.OnceFunc(func() { cancel(); <-done }))
		addrs = append(addrs, resolver.Address{Addr: addr})
	}
	t.Cleanup(func() {
		for _, stop := range stops {
			stop()
		}
	})
	r := manual.NewBuilderWithScheme("affine")
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := Dial(r.Scheme()+":///replicas", grpc.WithResolvers(r), SessionAffinity(header))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(key string) {
		t.Helper()
		ctx := t.Context()
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, header, key)
		}
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
	}
	// owners returns the replica each key reached, failing a key that
	// reached more than one.
	owners := func() map[string]int {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for key, by := range served {
			if key == "" {
				continue
			}
			if len(by) != 1 {
				t.Errorf("key %q reached replicas %v, want one", key, by)
			}
			for i := range by {
				out[key] = i
			}
		}
		return out
	}
	for range calls {
		for k := range keys {
			check(fmt.Sprintf("session-%d", k))
		}
		check("")
	}
	own := owners()
	used := map[int]bool{}
	for _, i := range own {
		used[i] = true
	}
	if len(own) != keys || len(used) < 2 {
		t.Fatalf("%d keys over replicas %v; want %d keys over more than one replica", len(own), used, keys)
	}
	if n := len(served[""]); n == 0 {
		t.Errorf("calls without the header reached no replica")
	}

	// Stop the replica of session-0: its keys move, the others stay.
	gone := own["session-0"]
	stops[gone]()
	mu.Lock()
	served = map[string]map[int]int{}
	mu.Unlock()
	for range calls {
		for k := range keys {
			check(fmt.Sprintf("session-%d", k))
		}
	}
	for key, i := range owners() {
		switch {
		case i == gone:
			t.Errorf("key %q reached the stopped replica %d", key, i)
		case own[key] != gone && own[key] != i:
			t.Errorf("key %q moved from replica %d to %d though its replica is up", key, own[key], i)
		}
	}
}

// TestSessionAffinityHeaderKeyOff: with gRPC told to ignore
// requestHashHeader, ring_hash would fail every call (it then expects an
// xDS hash); SessionAffinity falls back to round_robin and calls succeed.
// gRPC reads the variable when it starts, so the test runs again in a
// process started with it.
func TestSessionAffinityHeaderKeyOff(t *testing.T) {
	if os.Getenv(ringHashHeaderEnv) != "false" {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestSessionAffinityHeaderKeyOff$", "-test.count=1")
		cmd.Env = append(os.Environ(), ringHashHeaderEnv+"=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	addr, _, cancel, done := serveLocal(t, New(Config{}))
	defer func() { cancel(); <-done }()
	conn, err := Dial(addr, SessionAffinity("dsh-session-id"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(metadata.AppendToOutgoingContext(t.Context(), "dsh-session-id", "s"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}
