package agent_test

import (
	"context"
	"database/sql"
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
// schema version in that transaction.
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

			gw := &fakes.Gateway{}
			gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
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
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()

			// Truthful while starting: the agent as a whole is not serving.
			hc := healthpb.NewHealthClient(conn)
			for _, svc := range []string{"", agent.HealthService} {
				r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
					t.Fatalf("health %q while the store opens = %v, %v; want NOT_SERVING", svc, r.GetStatus(), err)
				}
				<-arrived // this Check's own
			}

			type result struct {
				resp *agentv1.CreateSessionResponse
				err  error
			}
			created := make(chan result, 1)
			go func() {
				resp, err := agentv1.NewAgentServiceClient(conn).CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "early",
					Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
				created <- result{resp, err}
			}()
			if m := <-arrived; m != agentv1.AgentService_CreateSession_FullMethodName {
				t.Fatalf("arrived %s, want CreateSession", m)
			}
			select {
			case r := <-created:
				t.Fatalf("CreateSession answered while the store was still opening: %v, %v", r.resp, r.err)
			case <-ready:
				t.Fatal("Ready while the store was still opening")
			default:
			}

			if _, err := hold.ExecContext(ctx, release); err != nil {
				t.Fatal(err)
			}
			hold.Close()
			r := <-created
			if fail {
				if status.Code(r.err) != codes.Unavailable || !strings.Contains(r.err.Error(), "failed to start") || !strings.Contains(r.err.Error(), "schema version 99") {
					t.Fatalf("CreateSession with a store that failed to open = %v, want UNAVAILABLE naming the store's error", r.err)
				}
				if err := <-done; err == nil || !strings.Contains(err.Error(), "schema version 99") {
					t.Fatalf("Run = %v, want the store's error", err)
				}
				return
			}
			if r.err != nil || r.resp.GetSession().GetHeader().GetId() != "early" {
				t.Fatalf("CreateSession while the store opened = %v, %v", r.resp, r.err)
			}
			<-ready
			got, err := agentv1.NewAgentServiceClient(conn).GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "early"})
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
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}
