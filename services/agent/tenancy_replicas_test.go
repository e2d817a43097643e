package agent_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/testing/protocmp"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// tenantReplica is one agent replica (agent.Run on the shared PostgreSQL
// store, token authentication) and the forwarded calls it received.
type tenantReplica struct {
	*agentProc
	name string
	fwd  *forwardLog
}

// forwardLog records the calls a replica received marked as forwarded
// (cluster.ForwardedHeader): their method, session and credential.
type forwardLog struct {
	mu    sync.Mutex
	calls []forwardedCall
}

type forwardedCall struct{ method, session, authorization string }

func (f *forwardLog) note(ctx context.Context, method string, req any) {
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get(cluster.ForwardedHeader)) == 0 {
		return
	}
	c := forwardedCall{method: method, authorization: strings.Join(md.Get("authorization"), ",")}
	if r, ok := req.(interface{ GetSessionId() string }); ok {
		c.session = r.GetSessionId()
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

// of returns the methods of the forwarded calls for session made with
// who's token.
func (f *forwardLog) of(session, who string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var methods []string
	for _, c := range f.calls {
		if c.session == session && c.authorization == "Bearer token-"+who {
			methods = append(methods, c.method)
		}
	}
	return methods
}

// options are server options that note forwarded calls before the edge
// sees them.
func (f *forwardLog) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			f.note(ctx, info.FullMethod, req)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &notingStream{ServerStream: ss, f: f, method: info.FullMethod})
		}),
	}
}

// notingStream notes a streaming call at its first request.
type notingStream struct {
	grpc.ServerStream
	f      *forwardLog
	method string
	seen   bool
}

func (s *notingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.seen {
		s.seen = true
		s.f.note(s.Context(), s.method, m)
	}
	return err
}

// startTenantReplica starts a replica on dsn whose deployment asks before
// bash, against the shared fake gateway and toolhost.
func startTenantReplica(t *testing.T, name, dsn string, b backend) *tenantReplica {
	t.Helper()
	r := &tenantReplica{name: name, fwd: &forwardLog{}}
	r.agentProc = startAgentWith(t, b, t.TempDir(), func(sc *agent.ServerConfig) {
		sc.Store, sc.PostgresDSN = "postgres", dsn
		sc.Auth, sc.ServerOptions = probeAuth(t), r.fwd.options()
		sc.Service.DefaultCwd = "/work"
		sc.Service.Approval = agent.ApprovalConfig{Rules: agent.DefaultApprovalRules(), Timeout: time.Minute}
	})
	return r
}

// replicaPair is two tenant replicas, r1 and r2, on one fresh database,
// against a shared fake gateway and toolhost, and a connection to the
// database.
type replicaPair struct {
	r1, r2 *tenantReplica
	db     *pgx.Conn
	gw     *fakes.Gateway
	host   *fakes.ToolHost
	dsn    string
	b      backend
}

func startReplicaPair(t *testing.T) *replicaPair {
	t.Helper()
	c := &replicaPair{dsn: pgtest.Database(t), gw: &fakes.Gateway{}, host: fakes.NewToolHost(bashTool)}
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, c.gw) })
	thAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, c.host) })
	c.b = backend{gwAddr: gwAddr, thAddr: thAddr}
	c.r1, c.r2 = c.start(t, "r1"), c.start(t, "r2")
	db, err := pgx.Connect(t.Context(), c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	c.db = db
	return c
}

// start starts one more replica on the pair's database.
func (c *replicaPair) start(t *testing.T, name string) *tenantReplica {
	t.Helper()
	return startTenantReplica(t, name, c.dsn, c.b)
}

// leaseRow is a session's lease as the replicas share it.
type leaseRow struct {
	Owner string
	Epoch int64
	Live  bool
}

func leaseOf(t *testing.T, db *pgx.Conn, id string) leaseRow {
	t.Helper()
	var l leaseRow
	if err := db.QueryRow(t.Context(), `SELECT owner, epoch, expires_at > now() FROM dsh_leases WHERE session_id = $1`, id).Scan(&l.Owner, &l.Epoch, &l.Live); err != nil {
		t.Fatalf("lease of %s: %v", id, err)
	}
	return l
}

// victimView is what the victim's tenant can see of its session.
type victimView struct {
	log      []*sessionv1.SessionEvent
	messages []*llmv1.Message
	session  *agentv1.Session // nil when not compared (read on a replica that just loaded it)
	listed   []string         // the ids its tenant lists
}

// viewOf reads who's view of session id through c.
func viewOf(t *testing.T, c agentv1.AgentServiceClient, who, id string, withSession bool) victimView {
	t.Helper()
	ctx := as(t.Context(), who)
	var v victimView
	st, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s reads its log: %v", who, err)
		}
		v.log = append(v.log, resp.GetEvent())
	}
	msgs, err := c.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: id})
	if err != nil {
		t.Fatalf("%s reads its messages: %v", who, err)
	}
	v.messages = msgs.GetMessages()
	if withSession {
		s, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
		if err != nil {
			t.Fatalf("%s reads its session: %v", who, err)
		}
		v.session = s.GetSession()
	}
	list, err := c.ListSessions(ctx, &agentv1.ListSessionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.GetSessions() {
		v.listed = append(v.listed, s.GetHeader().GetId())
	}
	return v
}

// diff is how w differs from v; sessions are compared when both were read.
func (v victimView) diff(w victimView) string {
	if v.session == nil || w.session == nil {
		v.session, w.session = nil, nil
	}
	return cmp.Diff(v, w, cmp.AllowUnexported(victimView{}), protocmp.Transform())
}

// replicaProbes are sessionProbes as an attacker aims them at a session on
// replicas: Respond answers the victim's pending request (its real id),
// and StreamEvents also follows from seq 0 with live progress.
func replicaProbes(pending string) map[string]probe {
	ps := maps.Clone(sessionProbes)
	ps["Respond"] = func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Respond(ctx, &agentv1.RespondRequest{SessionId: id, RequestId: pending,
			Answer: &agentv1.RespondRequest_Approval{Approval: &agentv1.ApprovalResponse{Decision: agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_FOR_SESSION}}})
		return err
	}
	ps["StreamEvents/follow"] = func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		s, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, IncludeProgress: true})
		if err != nil {
			return err
		}
		_, err = s.Recv() // the first event, or the refusal
		return err
	}
	return ps
}

// spoofs are the metadata an attacker adds to its own credential: the mark
// of a call one replica forwarded to another, and claims of the victim's
// tenant under the names a deployment might read.
var spoofs = []struct {
	name string
	md   []string
}{
	{"plain", nil},
	{"forwarded-mark", []string{cluster.ForwardedHeader, "1"}},
	{"tenant-claims", []string{"dsh-tenant", "acme", "x-dsh-tenant", "acme", "tenant", "acme", "x-tenant-id", "acme", "dsh-subject", "alice"}},
	{"forwarded-as-acme", []string{cluster.ForwardedHeader, "1", "dsh-tenant", "acme", "x-dsh-tenant", "acme"}},
}

// crossProbe runs every probe as beta through entry, with each spoof, against
// the victim's session and a session that does not exist: the answer must
// be NOT_FOUND with the message of the missing session.
func crossProbe(t *testing.T, entry *tenantReplica, victim, pending string) {
	t.Helper()
	for _, sp := range spoofs {
		for rpc, call := range replicaProbes(pending) {
			t.Run(entry.name+"/"+sp.name+"/"+rpc, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(as(t.Context(), "beta"), 10*time.Second)
				defer cancel()
				if sp.md != nil {
					ctx = metadata.AppendToOutgoingContext(ctx, sp.md...)
				}
				missing := call(ctx, entry.client, "no-such-session")
				cross := call(ctx, entry.client, victim)
				if code(missing) != codes.NotFound {
					t.Fatalf("beta's %s on a missing session through %s: %v, want NotFound", rpc, entry.name, missing)
				}
				if code(cross) != codes.NotFound {
					t.Fatalf("beta's %s on acme's session through %s: %v, want NotFound", rpc, entry.name, cross)
				}
				if a, b := strings.ReplaceAll(cross.Error(), victim, "ID"), strings.ReplaceAll(missing.Error(), "no-such-session", "ID"); a != b {
					t.Fatalf("cross message %q differs from the missing-session message %q", a, b)
				}
			})
		}
	}
}

// TestCrossTenantThroughReplicas attacks the tenant boundary where a
// replica that does not own a session forwards calls to the one that does
// (two replicas on one PostgreSQL database, token authentication). Tenant
// acme's session lives on replica r1; tenant beta calls r2, which finds
// the stored session (a replica stores a created session at once) but
// holds no lease. At each stage of the session's life (created with no
// prompt, a turn waiting for an approval, idle after a turn, its owner
// gone with the lease released) every AgentService RPC naming it, with or
// without a forwarded mark or claims of acme in the metadata, through r2
// and straight at r1, is NOT_FOUND exactly like a missing session; r2
// never forwards beta's calls (it answers from the stored header); beta
// lists none of acme's sessions on either replica; beta's CreateSession
// with acme's id, through every running replica (once the owner is gone,
// r2 and a replica r3 started since), with and without a request_id, is
// the ALREADY_EXISTS of beta's own taken id and claims neither lease; and
// the victim's log, messages, session, list and lease are unchanged.
// acme's own calls through r2 are forwarded and answered (the path exists).
func TestCrossTenantThroughReplicas(t *testing.T) {
	t.Parallel()
	c := startReplicaPair(t)
	gw, host, db := c.gw, c.host, c.db
	r1, r2 := c.r1, c.r2
	ctx := t.Context()

	const victim, betaOwn = "acme-victim", "beta-own"
	for who, id := range map[string]string{"acme": victim, "beta": betaOwn} {
		resp, err := r1.client.CreateSession(as(ctx, who), &agentv1.CreateSessionRequest{SessionId: id, Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
		if err != nil || resp.GetSession().GetHeader().GetTenant() != who {
			t.Fatalf("%s creates %s on r1: %v %v", who, id, resp, err)
		}
	}
	r1lease := leaseOf(t, db, victim)
	bystanders := []*tenantReplica{r2} // replicas that never held acme's session

	// attack runs the attacks of one stage. owner is the replica holding
	// acme's session, nil once none does: then before is acme's view from
	// when r1 held it (reading it now would claim it).
	attack := func(t *testing.T, owner *tenantReplica, before victimView, pending string) {
		lease := leaseOf(t, db, victim)
		if owner != nil {
			before = viewOf(t, owner.client, "acme", victim, true)
		}
		forwarded := len(r1.fwd.of(victim, "beta"))
		crossProbe(t, r2, victim, pending)
		if got := r1.fwd.of(victim, "beta")[forwarded:]; len(got) != 0 {
			t.Errorf("r2 forwarded beta's calls for acme's session to r1: %v; want r2 to answer them from the stored header", got)
		}
		if owner != nil {
			// Straight at the owner, as a peer replica would call it.
			crossProbe(t, owner, victim, pending)
			_, err := owner.client.GetSession(metadata.AppendToOutgoingContext(ctx, cluster.ForwardedHeader, "1"), &agentv1.GetSessionRequest{SessionId: victim})
			if code(err) != codes.Unauthenticated {
				t.Errorf("a forwarded mark without a token at the owner: %v, want Unauthenticated", err)
			}
		}
		live := slices.Clone(bystanders)
		if owner != nil {
			live = append(live, owner)
		}
		for _, r := range live {
			resp, err := r.client.ListSessions(as(ctx, "beta"), &agentv1.ListSessionsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, s := range resp.GetSessions() {
				ids = append(ids, s.GetHeader().GetId())
			}
			if !slices.Equal(ids, []string{betaOwn}) {
				t.Errorf("beta lists %v on %s, want only %s", ids, r.name, betaOwn)
			}
			for _, tenant := range []string{"acme", "*"} {
				if _, err := r.client.ListSessions(as(ctx, "beta"), &agentv1.ListSessionsRequest{Tenant: tenant}); code(err) != codes.PermissionDenied {
					t.Errorf("beta lists tenant %q on %s: %v, want PermissionDenied", tenant, r.name, err)
				}
			}
		}
		takenIDs(t, db, live, victim, betaOwn)
		if got := leaseOf(t, db, victim); got != lease {
			t.Errorf("acme's lease went from %+v to %+v under beta's calls", lease, got)
		}
		reader := owner
		if reader == nil {
			reader = r2 // claims and loads it, for acme
		}
		if d := before.diff(viewOf(t, reader.client, "acme", victim, owner != nil)); d != "" {
			t.Errorf("acme's session changed under beta's calls (-before +after):\n%s", d)
		}
		// acme's own call through r2 is served (forwarded while r1 owns it).
		n := len(r1.fwd.of(victim, "acme"))
		got, err := r2.client.GetSession(as(ctx, "acme"), &agentv1.GetSessionRequest{SessionId: victim})
		if err != nil || got.GetSession().GetHeader().GetTenant() != "acme" {
			t.Fatalf("acme's GetSession through r2: %v %v", got, err)
		}
		if owner != nil && len(r1.fwd.of(victim, "acme")) != n+1 {
			t.Errorf("acme's call through r2 was not forwarded to r1: r2 owns the session it should not")
		}
	}

	// acme's session, created on r1, has no event yet: r2 finds its stored
	// row.
	t.Run("created", func(t *testing.T) { attack(t, r1, victimView{}, "r1") })

	// acme's first turn calls bash, which waits for acme's approval.
	gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", bashCall("c1", "echo acme"))}, fakes.Response{Chunks: fakes.Text("done")})
	followCtx, stopFollow := context.WithCancel(as(ctx, "acme"))
	defer stopFollow()
	events := follow(t, followCtx, r1.client, victim)
	if _, err := r1.client.Send(as(ctx, "acme"), &agentv1.SendRequest{SessionId: victim, Content: text("run it")}); err != nil {
		t.Fatal(err)
	}
	asked := until(t, events, "acme's approval request", func(ev *sessionv1.SessionEvent) bool { return ev.GetApprovalAsked() != nil })
	pending := asked[len(asked)-1].GetApprovalAsked().GetId()
	t.Run("awaiting-approval", func(t *testing.T) { attack(t, r1, victimView{}, pending) })
	if got := host.Executed(); len(got) != 0 {
		t.Fatalf("bash ran before acme answered: %v", got)
	}
	if _, err := r1.client.Respond(as(ctx, "acme"), &agentv1.RespondRequest{SessionId: victim, RequestId: pending,
		Answer: &agentv1.RespondRequest_Approval{Approval: &agentv1.ApprovalResponse{Decision: agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_ONCE}}}); err != nil {
		t.Fatal(err)
	}
	ended := until(t, events, "acme's first turn to end", turnEnd(1))
	if end := ended[len(ended)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil {
		t.Fatalf("acme's first turn ended %v, want completed", end)
	}
	if got := host.Executed(); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("tool calls run in acme's turn: %v, want its bash call c1 once", got)
	}
	stopFollow()
	if _, err := r1.client.WaitIdle(as(ctx, "acme"), &agentv1.WaitIdleRequest{SessionId: victim}); err != nil {
		t.Fatal(err) // the turn/end is in the log before the loop is idle
	}

	// Owned and loaded by r1, idle.
	t.Run("idle-after-a-turn", func(t *testing.T) { attack(t, r1, victimView{}, pending) })

	// r1 stops gracefully and releases the lease: nobody owns the session.
	// beta's calls through r2 must not claim or load it.
	before := viewOf(t, r1.client, "acme", victim, false)
	r1.stop(t)
	if l := leaseOf(t, db, victim); l.Live || l.Owner != r1lease.Owner {
		t.Fatalf("acme's lease after r1's graceful stop: %+v; want r1's, released", l)
	}
	// A replica started since, which never held the session, is asked too.
	bystanders = append(bystanders, c.start(t, "r3"))
	t.Run("owner-gone", func(t *testing.T) { attack(t, nil, before, pending) })
	if l := leaseOf(t, db, victim); !l.Live || l.Owner == r1lease.Owner || l.Epoch != r1lease.Epoch+1 {
		t.Errorf("acme's lease after acme's own call through r2: %+v; want r2's at epoch %d", l, r1lease.Epoch+1)
	}
}

// takenIDs has beta create, through each replica, a session with acme's
// id (victim) and with its own taken id, with and without a request_id:
// both are the same AlreadyExists, and neither session's lease row moves
// (while nobody holds acme's session, the replica asked could have
// claimed it before finding the id taken, moving it to a replica of beta's
// choosing).
func takenIDs(t *testing.T, db *pgx.Conn, through []*tenantReplica, victim, own string) {
	t.Helper()
	ctx := t.Context()
	opts := &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}
	for _, r := range through {
		for _, rid := range []string{"", "beta-create"} {
			leases := map[string]leaseRow{victim: leaseOf(t, db, victim), own: leaseOf(t, db, own)}
			_, errOther := r.client.CreateSession(as(ctx, "beta"), &agentv1.CreateSessionRequest{SessionId: victim, RequestId: rid, Options: opts})
			_, errOwn := r.client.CreateSession(as(ctx, "beta"), &agentv1.CreateSessionRequest{SessionId: own, RequestId: rid, Options: opts})
			if code(errOther) != codes.AlreadyExists || strings.ReplaceAll(errOther.Error(), victim, "ID") != strings.ReplaceAll(errOwn.Error(), own, "ID") {
				t.Errorf("beta creates acme's id on %s (request_id %q): %v; its own: %v; want the same AlreadyExists", r.name, rid, errOther, errOwn)
			}
			for id, before := range leases {
				if got := leaseOf(t, db, id); got != before {
					t.Errorf("beta's CreateSession of taken id %s on %s (request_id %q) moved its lease from %+v to %+v", id, r.name, rid, before, got)
				}
			}
		}
	}
}

// TestCreateRetryThroughReplicas: a CreateSession retried with its
// request_id is answered with the session it made through any replica
// (forwarded to the owner while one holds it, claimed by the replica asked
// once none does), while the same session id sent by another tenant, with
// the same request_id or not, or by its own tenant with another
// request_id, is ALREADY_EXISTS with one message and moves no lease,
// whether or not a replica holds the session.
func TestCreateRetryThroughReplicas(t *testing.T) {
	t.Parallel()
	c := startReplicaPair(t)
	r1, r2, db := c.r1, c.r2, c.db
	ctx := t.Context()

	const id, rid = "acme-made", "acme-create-1"
	opts := &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}
	create := func(r *tenantReplica, who, rid string) (*agentv1.Session, error) {
		resp, err := r.client.CreateSession(as(ctx, who), &agentv1.CreateSessionRequest{SessionId: id, RequestId: rid, Options: opts})
		return resp.GetSession(), err
	}
	made, err := create(r1, "acme", rid)
	if err != nil {
		t.Fatal(err)
	}

	// collisions are the creates of acme's id that are not its retry.
	collisions := func(t *testing.T, through ...*tenantReplica) {
		t.Helper()
		for _, r := range through {
			for _, c := range []struct{ who, rid string }{{"beta", rid}, {"beta", "beta-create-1"}, {"beta", ""}, {"acme", "acme-create-2"}, {"acme", ""}} {
				before := leaseOf(t, db, id)
				_, err := create(r, c.who, c.rid)
				if want := `rpc error: code = AlreadyExists desc = create session acme-made: session "acme-made": session already exists`; err == nil || err.Error() != want {
					t.Errorf("%s creates %s with request_id %q through %s: %v; want %s", c.who, id, c.rid, r.name, err, want)
				}
				if got := leaseOf(t, db, id); got != before {
					t.Errorf("%s's create of %s with request_id %q through %s moved its lease from %+v to %+v", c.who, id, c.rid, r.name, before, got)
				}
			}
		}
	}
	retry := func(t *testing.T, r *tenantReplica) {
		t.Helper()
		got, err := create(r, "acme", rid)
		if err != nil || got.GetHeader().GetId() != id || got.GetHeader().GetTenant() != "acme" || got.GetHeader().GetCreatedAt() != made.GetHeader().GetCreatedAt() {
			t.Fatalf("acme's retry through %s: %v %v; want the session it made", r.name, got, err)
		}
	}

	// r1 holds the session: the retry through r2 is forwarded to it.
	collisions(t, r2, r1)
	n := len(r1.fwd.of(id, "acme"))
	retry(t, r2)
	if len(r1.fwd.of(id, "acme")) != n+1 {
		t.Errorf("acme's retry through r2 was not forwarded to r1, which holds the session")
	}
	if l := leaseOf(t, db, id); !l.Live {
		t.Errorf("acme's lease after its retry: %+v; want r1's, live", l)
	}

	// Nobody holds it: the collisions through r2 must not claim it; the
	// retry does.
	r1lease := leaseOf(t, db, id)
	r1.stop(t)
	collisions(t, r2)
	retry(t, r2)
	if l := leaseOf(t, db, id); !l.Live || l.Owner == r1lease.Owner || l.Epoch != r1lease.Epoch+1 {
		t.Errorf("acme's lease after its retry through r2 once r1 stopped: %+v; want r2's at epoch %d", l, r1lease.Epoch+1)
	}
}
