package agent_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/gateway"
)

// TestGetSessionDoesNotLoad: GetSession on an unloaded session reports it
// UNLOADED with its stored length, from the store's header, and leaves it
// unloaded (ListSessions still says so); the next command loads it as
// before.
func TestGetSessionDoesNotLoad(t *testing.T) {
	t.Parallel()
	var budget atomic.Int64
	gw := budgetGateway(&budget)
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	ctx := context.Background()
	svc, closeAll := sqliteService(t, ctx, filepath.Join(t.TempDir(), "sessions.db"), gwAddr)
	defer closeAll()
	if _, err := svc.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "p", Cwd: "/work",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Send(ctx, &agentv1.SendRequest{SessionId: "p", Content: []*llmv1.ContentBlock{session.Text("hi")}}); err != nil {
		t.Fatal(err)
	}
	idle, err := svc.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "p"})
	if err != nil {
		t.Fatal(err)
	}
	for !svc.Unload(ctx, "p") {
		if _, err := svc.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := svc.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.GetSession(); s.GetStatus() != agentv1.AgentStatus_AGENT_STATUS_UNLOADED || s.GetNextSeq() != idle.GetSession().GetNextSeq() || s.GetHeader().GetId() != "p" {
		t.Fatalf("GetSession of an unloaded session = %v, want UNLOADED with next_seq %d", s, idle.GetSession().GetNextSeq())
	}
	list, err := svc.ListSessions(ctx, &agentv1.ListSessionsRequest{})
	if err != nil || len(list.GetSessions()) != 1 || list.GetSessions()[0].GetStatus() != agentv1.AgentStatus_AGENT_STATUS_UNLOADED {
		t.Fatalf("after GetSession, ListSessions = %v %v; want the session still unloaded", list, err)
	}
	if _, err := svc.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "missing"}); err == nil {
		t.Fatal("GetSession of a missing session succeeded")
	}
	w, err := svc.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "p"}) // a command loads it
	if err != nil || w.GetSession().GetStatus() != agentv1.AgentStatus_AGENT_STATUS_IDLE {
		t.Fatalf("WaitIdle after GetSession = %v %v, want the session loaded and IDLE", w, err)
	}
}

// sqliteService builds a Service on a SQLite store (NORMAL) at path whose
// LLM is the gateway at gwAddr; closeAll closes the service, the
// connection and the store, in that order.
func sqliteService(t *testing.T, ctx context.Context, path, gwAddr string) (svc *agent.Service, closeAll func()) {
	t.Helper()
	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(gwAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	svc, err = agent.New(agent.Config{}, agent.Deps{Store: store, LLM: gateway.New(conn)}, nil)
	if err != nil {
		conn.Close()
		store.Close()
		t.Fatal(err)
	}
	return svc, func() {
		svc.Close(ctx)
		conn.Close()
		store.Close()
	}
}
