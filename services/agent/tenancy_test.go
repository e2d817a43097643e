package agent_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// The tokens of the probe suite: two tenants with a writer each, a reader
// of acme, and an admin of a third tenant.
var probeTokens = map[string]string{
	"acme":        "acme writer alice writer",
	"beta":        "beta writer bob writer",
	"acme-reader": "acme reader rita reader",
	"admin":       "ops admin root admin",
}

func probeAuth(t *testing.T) auth.Authenticator { return probeAuthWith(t, nil) }

// probeAuthWith authenticates probeTokens plus extra ("token-<key>" ->
// "tenant description subject roles").
func probeAuthWith(t *testing.T, extra map[string]string) auth.Authenticator {
	t.Helper()
	var lines []string
	all := maps.Clone(probeTokens)
	maps.Copy(all, extra)
	for tok, rest := range all {
		f := strings.Fields(rest)
		h := sha256.Sum256([]byte("token-" + tok))
		lines = append(lines, "sha256:"+hex.EncodeToString(h[:])+" "+f[0]+" "+f[2]+" "+f[3])
	}
	toks, err := auth.ParseTokens(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// as returns ctx with who's bearer token.
func as(ctx context.Context, who string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token-"+who)
}

// probe is one AgentService RPC aimed at a session; it returns the call's
// error.
type probe func(ctx context.Context, c agentv1.AgentServiceClient, id string) error

func text(s string) []*llmv1.ContentBlock { return []*llmv1.ContentBlock{session.Text(s)} }

// sessionProbes covers every AgentService RPC that names a session.
var sessionProbes = map[string]probe{
	"GetSession": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
		return err
	},
	"GetMessages": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: id})
		return err
	},
	"WaitIdle": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id})
		return err
	},
	"StreamEvents": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		s, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
		if err != nil {
			return err
		}
		for {
			if _, err := s.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	},
	"Send": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: text("probe send")})
		return err
	},
	"Steer": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Steer(ctx, &agentv1.SteerRequest{SessionId: id, Content: text("probe steer")})
		return err
	},
	"Inject": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Inject(ctx, &agentv1.InjectRequest{SessionId: id, Content: text("probe inject")})
		return err
	},
	"Cancel": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Cancel(ctx, &agentv1.CancelRequest{SessionId: id})
		return err
	},
	"ForkSession": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.ForkSession(ctx, &agentv1.ForkSessionRequest{SessionId: id})
		return err
	},
	"Respond": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Respond(ctx, &agentv1.RespondRequest{SessionId: id, RequestId: "r1",
			Answer: &agentv1.RespondRequest_Approval{Approval: &agentv1.ApprovalResponse{Decision: agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_ONCE}}})
		return err
	},
	"Compact": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.Compact(ctx, &agentv1.CompactRequest{SessionId: id})
		return err
	},
	"UpdateSession": func(ctx context.Context, c agentv1.AgentServiceClient, id string) error {
		_, err := c.UpdateSession(ctx, &agentv1.UpdateSessionRequest{SessionId: id, Title: "probe",
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"title"}}})
		return err
	},
}

// sessionlessRPCs are the RPCs that name no existing session; they are
// probed separately below.
var sessionlessRPCs = []string{"CreateSession", "ListSessions"}

func TestProbesCoverEveryRPC(t *testing.T) {
	t.Parallel()
	sd := agentv1.AgentService_ServiceDesc
	var names []string
	for _, m := range sd.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range sd.Streams {
		names = append(names, s.StreamName)
	}
	for _, n := range names {
		if _, ok := sessionProbes[n]; !ok && !slices.Contains(sessionlessRPCs, n) {
			t.Errorf("AgentService.%s has no cross-tenant probe", n)
		}
	}
}

// A cross-tenant probe suite: two tenants, every AgentService RPC from each
// against the other's sessions and its own.
func TestCrossTenantProbes(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		tenants = map[string][]string{} // session id -> tenants seen in ToolContext
	)
	e := newEnvAuth(t, probeAuth(t), nil, fakes.Tool{Name: "whoami", Run: func(_ context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		mu.Lock()
		tenants[ex.GetContext().GetSessionId()] = append(tenants[ex.GetContext().GetSessionId()], ex.GetContext().GetTenant())
		mu.Unlock()
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{fakes.TextContent("ok")}}
	}})
	e.gw.Default = func(req *llmv1.GenerateRequest) fakes.Response {
		// Call the tool once per turn, then answer.
		msgs := req.GetMessages()
		if last := msgs[len(msgs)-1]; last.GetRole() == llmv1.Role_ROLE_USER && len(last.GetContent()) > 0 && last.GetContent()[0].GetToolResult() == nil {
			return fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "w" + time.Now().Format("150405.000000000"), Name: "whoami", Args: `{}`})}
		}
		return fakes.Response{Chunks: fakes.Text("done")}
	}
	c := e.client
	ctx := t.Context()
	own := map[string]string{"acme": "acme-1", "beta": "beta-1"}
	other := map[string]string{"acme": "beta", "beta": "acme"}

	// Each tenant follows its own session from the start.
	follow := map[string]agentv1.AgentService_StreamEventsClient{}
	followCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	for who, id := range own {
		resp, err := c.CreateSession(as(ctx, who), &agentv1.CreateSessionRequest{SessionId: id, Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
		if err != nil {
			t.Fatalf("%s creates: %v", who, err)
		}
		if got := resp.GetSession().GetHeader().GetTenant(); got != who {
			t.Fatalf("%s's session has tenant %q", who, got)
		}
		st, err := c.StreamEvents(as(followCtx, who), &agentv1.StreamEventsRequest{SessionId: id})
		if err != nil {
			t.Fatal(err)
		}
		follow[who] = st
		if _, err := c.Send(as(ctx, who), &agentv1.SendRequest{SessionId: id, Content: text("hello from " + who)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitIdle(as(ctx, who), &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
			t.Fatal(err)
		}
	}

	for who := range own {
		victim := own[other[who]]
		for rpc, call := range sessionProbes {
			// The reference: the same RPC on a session that does not exist.
			missing := call(as(ctx, who), c, "no-such-session")
			cross := call(as(ctx, who), c, victim)
			t.Run(who+"/"+rpc, func(t *testing.T) {
				if code(cross) != codes.NotFound {
					t.Fatalf("%s on the other tenant's session: %v, want NotFound", rpc, cross)
				}
				// Exactly the message of a session that does not exist.
				if a, b := strings.ReplaceAll(cross.Error(), victim, "ID"), strings.ReplaceAll(missing.Error(), "no-such-session", "ID"); a != b {
					t.Fatalf("cross message %q differs from the missing-session message %q", a, b)
				}
			})
		}
	}
	// Own calls work. Respond names no pending request (NOT_FOUND of the
	// request, not of the session); the rest succeed.
	for who, id := range own {
		for rpc, call := range sessionProbes {
			err := call(as(ctx, who), c, id)
			switch {
			case rpc == "Respond":
				if code(err) == codes.OK || code(err) == codes.PermissionDenied {
					t.Errorf("%s Respond to no pending request on its own session: %v", who, err)
				}
			case rpc == "Compact":
				// Reached the session: it compacts, or says why not
				// (FAILED_PRECONDITION: nothing to compact).
				if c := code(err); c != codes.OK && c != codes.FailedPrecondition {
					t.Errorf("%s Compact on its own session: %v", who, err)
				}
			case err != nil:
				t.Errorf("%s %s on its own session: %v", who, rpc, err)
			}
			if _, err := c.WaitIdle(as(ctx, who), &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Sessionless RPCs: ListSessions shows the caller's tenant only; naming
	// the other tenant is PERMISSION_DENIED; ids are not an oracle for
	// CreateSession either (a collision answers alike for any owner).
	for who := range own {
		resp, err := c.ListSessions(as(ctx, who), &agentv1.ListSessionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetSessions() {
			if s.GetHeader().GetTenant() != who {
				t.Errorf("%s lists %s of tenant %q", who, s.GetHeader().GetId(), s.GetHeader().GetTenant())
			}
		}
		if len(resp.GetSessions()) < 2 { // its session and the fork
			t.Errorf("%s lists %d sessions, want its own session and fork", who, len(resp.GetSessions()))
		}
		if _, err := c.ListSessions(as(ctx, who), &agentv1.ListSessionsRequest{Tenant: other[who]}); code(err) != codes.PermissionDenied {
			t.Errorf("%s lists tenant %s: %v, want PermissionDenied", who, other[who], err)
		}
		_, errOther := c.CreateSession(as(ctx, who), &agentv1.CreateSessionRequest{SessionId: own[other[who]], Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
		_, errOwn := c.CreateSession(as(ctx, who), &agentv1.CreateSessionRequest{SessionId: own[who], Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
		if code(errOther) != codes.AlreadyExists || strings.ReplaceAll(errOther.Error(), own[other[who]], "ID") != strings.ReplaceAll(errOwn.Error(), own[who], "ID") {
			t.Errorf("%s creating an existing id: other's %v, own %v; want the same AlreadyExists", who, errOther, errOwn)
		}
	}

	// Forks inherit the tenant; tools saw the session's tenant.
	for who := range own {
		resp, err := c.ListSessions(as(ctx, who), &agentv1.ListSessionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetSessions() {
			if p := s.GetHeader().GetParentSession(); p != "" && p != own[who] {
				t.Errorf("%s's fork %s has parent %s", who, s.GetHeader().GetId(), p)
			}
		}
		mu.Lock()
		seen := tenants[own[who]]
		mu.Unlock()
		if len(seen) == 0 || slices.ContainsFunc(seen, func(s string) bool { return s != who }) {
			t.Errorf("tool calls of %s's session saw tenants %v", who, seen)
		}
	}

	// Each follower saw exactly its own session's log, nothing of the other.
	stopAt := map[string]int{}
	for who, id := range own {
		resp, err := c.GetSession(as(ctx, who), &agentv1.GetSessionRequest{SessionId: id})
		if err != nil {
			t.Fatal(err)
		}
		stopAt[who] = int(resp.GetSession().GetNextSeq())
	}
	for who, st := range follow {
		var got []*sessionv1.SessionEvent
		for len(got) < stopAt[who] {
			resp, err := st.Recv()
			if err != nil {
				t.Fatalf("%s follow: %v", who, err)
			}
			got = append(got, resp.GetEvent())
		}
		want := e.eventsCtx(as(ctx, who), own[who])
		for i := range got {
			if !proto.Equal(got[i], want[i]) {
				t.Fatalf("%s's stream event %d is not its session's event %d", who, i, i)
			}
		}
		for _, ev := range got {
			if strings.Contains(ev.String(), "hello from "+other[who]) {
				t.Fatalf("%s's stream carries the other tenant's prompt", who)
			}
		}
	}

	// A reader of acme reads but cannot write; an admin sees any tenant.
	if err := sessionProbes["GetSession"](as(ctx, "acme-reader"), c, own["acme"]); err != nil {
		t.Errorf("acme reader reads: %v", err)
	}
	if err := sessionProbes["Send"](as(ctx, "acme-reader"), c, own["acme"]); code(err) != codes.PermissionDenied {
		t.Errorf("acme reader sends: %v, want PermissionDenied", err)
	}
	if err := sessionProbes["GetSession"](as(ctx, "acme-reader"), c, own["beta"]); code(err) != codes.NotFound {
		t.Errorf("acme reader reads beta: %v, want NotFound", err)
	}
	if err := sessionProbes["GetMessages"](as(ctx, "admin"), c, own["beta"]); err != nil {
		t.Errorf("admin reads beta: %v", err)
	}
	resp, err := c.ListSessions(as(ctx, "admin"), &agentv1.ListSessionsRequest{Tenant: "beta"})
	if err != nil || len(resp.GetSessions()) == 0 || slices.ContainsFunc(resp.GetSessions(), func(s *agentv1.Session) bool { return s.GetHeader().GetTenant() != "beta" }) {
		t.Errorf("admin lists beta: %v %v", resp, err)
	}
	all, err := c.ListSessions(as(ctx, "admin"), &agentv1.ListSessionsRequest{Tenant: "*"})
	if err != nil {
		t.Fatal(err)
	}
	seenTenants := map[string]bool{}
	for _, s := range all.GetSessions() {
		seenTenants[s.GetHeader().GetTenant()] = true
	}
	if !seenTenants["acme"] || !seenTenants["beta"] {
		t.Errorf("admin lists every tenant: saw %v", seenTenants)
	}
	if _, err := c.ListSessions(as(ctx, "acme"), &agentv1.ListSessionsRequest{Tenant: "*"}); code(err) != codes.PermissionDenied {
		t.Errorf("acme lists every tenant: %v, want PermissionDenied", err)
	}
	if _, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: own["acme"]}); code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", err)
	}

	// After a restart every session is on disk only: a stranger's probes are
	// NOT_FOUND and do not load (or repair) the victim's session.
	stopFollow()
	e.restart()
	c = e.client
	for rpc, call := range sessionProbes {
		if err := call(as(ctx, "acme"), c, own["beta"]); code(err) != codes.NotFound {
			t.Errorf("acme %s on beta's unloaded session: %v, want NotFound", rpc, err)
		}
	}
	list, err := c.ListSessions(as(ctx, "beta"), &agentv1.ListSessionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.GetSessions() {
		if s.GetStatus() != agentv1.AgentStatus_AGENT_STATUS_UNLOADED {
			t.Errorf("beta's %s is %s after acme's probes, want UNLOADED", s.GetHeader().GetId(), s.GetStatus())
		}
	}
	if err := sessionProbes["GetMessages"](as(ctx, "beta"), c, own["beta"]); err != nil {
		t.Errorf("beta reads its unloaded session: %v", err)
	}
}

// A session stored before tenancy (a header without tenant) belongs to the
// default tenant: its owner reads it, another tenant gets NOT_FOUND, and
// ListSessions reports it under "default".
func TestLegacySessionIsDefaultTenant(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // --auth none: the local principal, tenant default
	e.create("legacy")
	e.send("legacy", "hi")
	e.waitIdle("legacy")
	e.stop()
	db, err := sql.Open("sqlite", filepath.Join(e.dir, "sessions.db"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec(`UPDATE sessions SET header = json_remove(header, '$.tenant') WHERE id = 'legacy'`)
	if err != nil {
		t.Fatal(err)
	}
	var h string
	if err := db.QueryRow(`SELECT header FROM sessions WHERE id = 'legacy'`).Scan(&h); err != nil || strings.Contains(h, "tenant") {
		t.Fatalf("header still names a tenant: %s %v %v", h, res, err)
	}
	db.Close()

	e.authn = probeAuthWith(t, map[string]string{"legacy": "default legacy lee reader"})
	e.start()
	ctx := t.Context()
	resp, err := e.client.GetSession(as(ctx, "legacy"), &agentv1.GetSessionRequest{SessionId: "legacy"})
	if err != nil || resp.GetSession().GetHeader().GetTenant() != auth.DefaultTenant {
		t.Fatalf("default tenant reads its legacy session: %v %v", resp, err)
	}
	if _, err := e.client.GetSession(as(ctx, "acme"), &agentv1.GetSessionRequest{SessionId: "legacy"}); code(err) != codes.NotFound {
		t.Fatalf("acme reads the legacy session: %v", err)
	}
	e.stop()
	e.start() // unloaded: ListSessions reads the stored header
	list, err := e.client.ListSessions(as(ctx, "legacy"), &agentv1.ListSessionsRequest{})
	if err != nil || len(list.GetSessions()) != 1 || list.GetSessions()[0].GetHeader().GetId() != "legacy" {
		t.Fatalf("default tenant lists: %v %v", list, err)
	}
	if list, err := e.client.ListSessions(as(ctx, "acme"), &agentv1.ListSessionsRequest{}); err != nil || len(list.GetSessions()) != 0 {
		t.Fatalf("acme lists: %v %v", list, err)
	}
}

// TestRequestIDIsPerTenant: two tenants that happen to use the same
// CreateSession request_id get two sessions; a retry answers each with its
// own, never the other tenant's (the key space is the tenant's).
func TestRequestIDIsPerTenant(t *testing.T) {
	t.Parallel()
	e := newEnvAuth(t, probeAuth(t), nil)
	ctx := t.Context()
	create := func(who string) string {
		t.Helper()
		resp, err := e.client.CreateSession(as(ctx, who), &agentv1.CreateSessionRequest{RequestId: "same-key",
			Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if got := resp.GetSession().GetHeader().GetTenant(); got != who {
			t.Fatalf("%s's retry answered with a session of tenant %q", who, got)
		}
		return resp.GetSession().GetHeader().GetId()
	}
	a, b := create("acme"), create("beta")
	if a == b {
		t.Fatalf("both tenants got session %s for the same request_id", a)
	}
	if again := create("beta"); again != b {
		t.Fatalf("beta's retry got %s, want %s", again, b)
	}
	if again := create("acme"); again != a {
		t.Fatalf("acme's retry got %s, want %s", again, a)
	}
}
