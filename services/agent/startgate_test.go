package agent_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// arrivals signals each call's arrival at the server (its headers read),
// before any handler runs.
type arrivals chan string

func (a arrivals) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (a arrivals) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (a arrivals) HandleConn(context.Context, stats.ConnStats) {}
func (a arrivals) HandleRPC(_ context.Context, s stats.RPCStats) {
	if h, ok := s.(*stats.InHeader); ok {
		a <- h.FullMethod
	}
}

// TestCallsWaitForTheStart: the agent accepts calls while its store is
// still opening (ServerConfig.Accepting comes first, Ready only after the
// open) and reports NOT_SERVING until it has started; a CreateSession that
// arrives then waits and succeeds once the store is open, or, when the
// store fails to open, fails UNAVAILABLE with the store's error instead of
// hanging or running on a half-started agent. The open is held by an
// exclusive SQLite transaction on the agent's database file (its open
// waits on it, as on any other writer); the failing case stamps an unknown
// schema version in that transaction. A StreamEvents waits likewise; a
// call whose deadline ends at the gate gets DEADLINE_EXCEEDED; a client
// with the CLI's retry policy gets the failed start's error, not a retry
// exhaustion; and an attacker's call (an unknown token) is refused at once
// by the edge, never held at the gate nor told of the start or its error.
func TestCallsWaitForTheStart(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		name := "store opens"
		if fail {
			name = "store fails to open"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			dir := t.TempDir()
			gw := &fakes.Gateway{}
			gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
			seedSession(t, ctx, filepath.Join(dir, "sessions.db"), gwAddr, "old")
			db, err := sql.Open("sqlite", filepath.Join(dir, "sessions.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			hold, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Close()
			if _, err := hold.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
				t.Fatal(err)
			}
			release := "ROLLBACK"
			if fail {
				if _, err := hold.ExecContext(ctx, "PRAGMA user_version = 99"); err != nil {
					t.Fatal(err)
				}
				release = "COMMIT"
			}

			thAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, fakes.NewToolHost()) })
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lis.Close() })
			arrived := make(arrivals, 16)
			accepting, ready := make(chan string, 1), make(chan string, 1)
			runCtx, stop := context.WithCancel(context.Background())
			defer stop()
			done := make(chan error, 1)
			go func() {
				done <- agent.Run(runCtx, agent.ServerConfig{Listener: lis, Gateway: gwAddr, Toolhosts: []string{"fake=" + thAddr},
					DataDir: dir, Synchronous: "NORMAL", NoTitles: true, Service: agent.Config{DefaultCwd: "/work"},
					Auth:          oneToken("good"),
					ServerOptions: []grpc.ServerOption{grpc.StatsHandler(arrived)},
					Accepting:     func(addr string) { accepting <- addr },
					Ready:         func(addr string) { ready <- addr }}, slog.New(slog.DiscardHandler))
			}()
			select {
			case <-accepting:
			case err := <-done:
				t.Fatalf("Run ended before accepting calls: %v", err)
			case <-ctx.Done():
				t.Fatal("the agent did not accept calls while its store was held")
			}
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithPerRPCCredentials(auth.Bearer("good", false)), grpc.WithDefaultServiceConfig(agent.ClientServiceConfig))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			client := agentv1.NewAgentServiceClient(conn)

			// Truthful while starting: the agent as a whole is not serving.
			hc := healthpb.NewHealthClient(conn)
			for _, svc := range []string{"", agent.HealthService} {
				r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
					t.Fatalf("health %q while the store opens = %v, %v; want NOT_SERVING", svc, r.GetStatus(), err)
				}
				within(t, ctx, arrived) // this Check's own
			}

			// An attacker's call is refused at once by the edge, not held
			// at the gate with the others, and never learns of the start
			// (nor, when it fails, of its error).
			intruder, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithPerRPCCredentials(auth.Bearer("guessed", false)))
			if err != nil {
				t.Fatal(err)
			}
			defer intruder.Close()
			refused := make(chan error, 1)
			go func() {
				_, err := agentv1.NewAgentServiceClient(intruder).CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "intruder",
					Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
				refused <- err
			}()
			select {
			case err := <-refused:
				if c := status.Code(err); c != codes.Unauthenticated || strings.Contains(err.Error(), "schema version") || strings.Contains(err.Error(), "failed to start") {
					t.Fatalf("an unauthenticated CreateSession while the agent starts = %v (%v), want UNAUTHENTICATED saying nothing of the start", err, c)
				}
			case <-ctx.Done():
				t.Fatal("an unauthenticated CreateSession was held at the start gate")
			}
			within(t, ctx, arrived) // the intruder's

			// A call whose deadline ends at the gate gets DEADLINE_EXCEEDED.
			dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, err = client.GetSession(dctx, &agentv1.GetSessionRequest{SessionId: "old"})
			dcancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("GetSession with a 50 ms deadline at the gate = %v, want DEADLINE_EXCEEDED", err)
			}
			within(t, ctx, arrived) // its own

			// A stream waits at the gate like a unary call.
			streamed := make(chan result, 1)
			go func() {
				st, err := client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "old", NoFollow: true})
				n := 0
				for err == nil {
					if _, err = st.Recv(); err == nil {
						n++
					}
				}
				if errors.Is(err, io.EOF) {
					err = nil
				}
				streamed <- result{n: n, err: err}
			}()
			if m := within(t, ctx, arrived); m != agentv1.AgentService_StreamEvents_FullMethodName {
				t.Fatalf("arrived %s, want StreamEvents", m)
			}

			created := make(chan result, 1)
			go func() {
				resp, err := client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "early",
					Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
				created <- result{resp: resp, err: err}
			}()
			if m := within(t, ctx, arrived); m != agentv1.AgentService_CreateSession_FullMethodName {
				t.Fatalf("arrived %s, want CreateSession", m)
			}
			select {
			case r := <-created:
				t.Fatalf("CreateSession answered while the store was still opening: %v, %v", r.resp, r.err)
			case r := <-streamed:
				t.Fatalf("StreamEvents answered while the store was still opening: %d events, %v", r.n, r.err)
			case <-ready:
				t.Fatal("Ready while the store was still opening")
			case <-time.After(100 * time.Millisecond):
			}

			if _, err := hold.ExecContext(ctx, release); err != nil {
				t.Fatal(err)
			}
			hold.Close()
			r, sr := within(t, ctx, created), within(t, ctx, streamed)
			if fail {
				// The CLI's retries (ClientServiceConfig) stop at the
				// start's error instead of retrying into a stopped server.
				if status.Code(r.err) != codes.Unavailable || !strings.Contains(r.err.Error(), "failed to start") || !strings.Contains(r.err.Error(), "schema version 99") {
					t.Fatalf("CreateSession with a store that failed to open = %v, want UNAVAILABLE naming the store's error", r.err)
				}
				if status.Code(sr.err) != codes.Unavailable || !strings.Contains(sr.err.Error(), "schema version 99") {
					t.Fatalf("StreamEvents with a store that failed to open = %v, want UNAVAILABLE naming the store's error", sr.err)
				}
				if err := within(t, ctx, done); err == nil || !strings.Contains(err.Error(), "schema version 99") {
					t.Fatalf("Run = %v, want the store's error", err)
				}
				return
			}
			if sr.err != nil || sr.n == 0 {
				t.Fatalf("StreamEvents at the gate = %d events, %v; want the stored session's events", sr.n, sr.err)
			}
			if r.err != nil || r.resp.GetSession().GetHeader().GetId() != "early" {
				t.Fatalf("CreateSession while the store opened = %v, %v", r.resp, r.err)
			}
			within(t, ctx, ready)
			got, err := client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "early"})
			if err != nil || got.GetSession().GetHeader().GetId() != "early" {
				t.Fatalf("GetSession after the start = %v, %v", got, err)
			}
			for _, svc := range []string{"", agent.HealthService, agent.HealthStore} {
				r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("health %q after the start = %v, %v; want SERVING", svc, r.GetStatus(), err)
				}
			}
			stop()
			if err := within(t, ctx, done); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// result is a call's outcome.
type result struct {
	resp *agentv1.CreateSessionResponse
	n    int // a stream's messages
	err  error
}

// within receives from c, failing the test when ctx ends first.
func within[T any](t *testing.T, ctx context.Context, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-ctx.Done():
		t.Fatal("timed out waiting")
		panic("unreachable")
	}
}

// oneToken authenticates only the bearer token it holds.
type oneToken string

// Authenticate implements auth.Authenticator.
func (o oneToken) Authenticate(_ context.Context, bearer string) (auth.Principal, error) {
	if bearer != string(o) {
		return auth.Principal{}, &auth.Error{Code: codes.Unauthenticated, Reason: "unknown token"}
	}
	return auth.Local(), nil
}

// seedSession stores a session id in the SQLite store at path.
func seedSession(t *testing.T, ctx context.Context, path, gwAddr, id string) {
	t.Helper()
	svc, closeAll := sqliteService(t, ctx, path, gwAddr)
	defer closeAll()
	// As the caller oneToken lets in; stored with its first event.
	ctx = auth.WithPrincipal(ctx, auth.Local())
	if _, err := svc.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: id, Cwd: "/work",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Inject(ctx, &agentv1.InjectRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("seeded")}}); err != nil {
		t.Fatal(err)
	}
}
