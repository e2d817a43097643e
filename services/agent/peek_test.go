package agent_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
	return sqliteServiceOver(t, ctx, path, gwAddr, nil)
}

// sqliteServiceOver is sqliteService with the store wrap returns for the
// SQLite store (nil: the store itself).
func sqliteServiceOver(t *testing.T, ctx context.Context, path, gwAddr string, wrap func(*sqlitestore.Store) agent.Store) (svc *agent.Service, closeAll func()) {
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
	var st agent.Store = store
	if wrap != nil {
		st = wrap(store)
	}
	svc, err = agent.New(agent.Config{}, agent.Deps{Store: st, LLM: gateway.New(conn)}, nil)
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

// heldLoads is a SQLite store whose Load waits until release is closed,
// once entered has said it began.
type heldLoads struct {
	*sqlitestore.Store
	entered chan struct{}
	release chan struct{}
}

func (h *heldLoads) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	h.entered <- struct{}{}
	<-h.release
	return h.Store.Load(ctx, id)
}

// TestLoadDuringCloseIsRefused: a Send that began loading its session
// before the drain and finishes loading after Close took the live
// sessions is refused (UNAVAILABLE) and starts no turn: Close would not
// wait for that turn, and the store closes under it.
func TestLoadDuringCloseIsRefused(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	gw := &fakes.Gateway{Default: func(*llmv1.GenerateRequest) fakes.Response {
		calls.Add(1)
		return fakes.Response{Chunks: fakes.Text("done")}
	}}
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "sessions.db")
	seedSession(t, ctx, path, gwAddr, "held")

	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	conn, err := grpc.NewClient(gwAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	held := &heldLoads{Store: store, entered: make(chan struct{}, 1), release: make(chan struct{})}
	svc, err := agent.New(agent.Config{}, agent.Deps{Store: held, LLM: gateway.New(conn)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := svc.Send(ctx, &agentv1.SendRequest{SessionId: "held", Content: []*llmv1.ContentBlock{session.Text("too late")}})
		sent <- err
	}()
	<-held.entered
	if err := svc.Close(ctx); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	if err := <-sent; status.Code(err) != codes.Unavailable {
		t.Fatalf("Send whose load ended after Close = %v, want UNAVAILABLE", err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the refused Send's turn called the model %d times", n)
	}
}
