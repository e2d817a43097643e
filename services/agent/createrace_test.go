package agent_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// heldCreates is a store whose first Create is held after the store took
// it: the session is registered, not yet live in the agent.
type heldCreates struct {
	*sqlitestore.Store
	held    atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (h *heldCreates) Create(ctx context.Context, hd *sessionv1.SessionHeader) error {
	err := h.Store.Create(ctx, hd)
	if h.held.CompareAndSwap(false, true) { // the first only (a sync.Once would hold the others too)
		close(h.entered)
		<-h.release
	}
	return err
}

// TestCreateRetryDuringCreate: a CreateSession retried with its request_id
// while the first is still creating the session (the client timed out and
// retried) is answered with that session, as is the first, never
// ALREADY_EXISTS; a create of the same id under another request_id still
// is ALREADY_EXISTS.
func TestCreateRetryDuringCreate(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{Default: func(*llmv1.GenerateRequest) fakes.Response { return fakes.Response{Chunks: fakes.Text("done")} }}
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	ctx := auth.WithPrincipal(t.Context(), auth.Local())
	held := &heldCreates{entered: make(chan struct{}), release: make(chan struct{})}
	svc, closeAll := sqliteServiceOver(t, ctx, filepath.Join(t.TempDir(), "sessions.db"), gwAddr, func(st *sqlitestore.Store) agent.Store {
		held.Store = st
		return held
	})
	defer closeAll()

	req := func(rid string) *agentv1.CreateSessionRequest {
		return &agentv1.CreateSessionRequest{SessionId: "s1", RequestId: rid, Cwd: "/work",
			Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}
	}
	type answer struct {
		resp *agentv1.CreateSessionResponse
		err  error
	}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(held.release) }) }
	t.Cleanup(release) // a failure below must not leave the first create held
	first, retry := make(chan answer, 1), make(chan answer, 1)
	go func() {
		resp, err := svc.CreateSession(ctx, req("r1"))
		first <- answer{resp, err}
	}()
	<-held.entered // the first is in the store, not yet live
	go func() {
		resp, err := svc.CreateSession(ctx, req("r1"))
		retry <- answer{resp, err}
	}()
	// The retry must wait for the first, not answer ALREADY_EXISTS; give
	// it the time to answer wrongly before the first goes on.
	select {
	case a := <-retry:
		t.Fatalf("the retry answered while the first create was still running: %v, %v", a.resp, a.err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	a, b := <-first, <-retry
	if a.err != nil || b.err != nil {
		t.Fatalf("first create: %v; its retry: %v; want both answered with the session", a.err, b.err)
	}
	if a.resp.GetSession().GetHeader().GetCreatedAt() != b.resp.GetSession().GetHeader().GetCreatedAt() ||
		b.resp.GetSession().GetHeader().GetRequestId() != "r1" {
		t.Fatalf("the retry got %v; want the first's session %v", b.resp.GetSession().GetHeader(), a.resp.GetSession().GetHeader())
	}
	if _, err := svc.CreateSession(ctx, req("r2")); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("another request's create of the same id: %v, want ALREADY_EXISTS", err)
	}
	// An admin of another tenant sees the session but did not make it: the
	// same id and request_id are its own request's, ALREADY_EXISTS.
	admin := auth.WithPrincipal(t.Context(), auth.Principal{Tenant: "ops", Subject: "root", Roles: []auth.Role{auth.RoleAdmin}})
	if resp, err := svc.CreateSession(admin, req("r1")); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("an admin of another tenant creating the id with the same request_id: %v, %v; want ALREADY_EXISTS", resp.GetSession().GetHeader(), err)
	}
}
