package auth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/cmdline"
)

func hashLine(token, rest string) string {
	h := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(h[:]) + " " + rest
}

func TestTokenFile(t *testing.T) {
	t.Parallel()
	good := strings.Join([]string{
		"# tokens of the acme deployment",
		"",
		hashLine("tok-alice", "acme alice reader,writer"),
		"   " + hashLine("tok-ops", "ops root admin") + "  ",
	}, "\n")
	toks, err := auth.ParseTokens(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	p, err := toks.Authenticate(t.Context(), "tok-alice")
	if err != nil || p.Tenant != "acme" || p.Subject != "alice" || !p.Has(auth.RoleWriter) || !p.Has(auth.RoleReader) {
		t.Fatalf("alice = %+v, %v", p, err)
	}
	for _, tc := range []struct {
		name, token string
		want        string
	}{
		{"missing", "", "missing credentials"},
		{"unknown", "tok-mallory", "unknown token"},
		{"a prefix of a known token", "tok-ali", "unknown token"},
	} {
		_, err := toks.Authenticate(t.Context(), tc.token)
		var ae *auth.Error
		if !asAuthError(err, &ae) || ae.Code != codes.Unauthenticated || !strings.Contains(ae.Reason, tc.want) {
			t.Errorf("%s: err = %v, want UNAUTHENTICATED %q", tc.name, err, tc.want)
		}
	}

	bad := []struct {
		name, file string
		want       string
	}{
		{"three fields", "# c\n" + hashLine("a", "acme alice"), "line 2: want 4 fields"},
		{"no sha256 prefix", "deadbeef acme alice reader", "line 1: the first field must start with sha256:"},
		{"short hash", "\n\nsha256:abcd acme alice reader", "line 3: the token hash must be 64 hex digits"},
		{"not hex", "sha256:" + strings.Repeat("zz", 32) + " acme alice reader", "line 1: the token hash must be 64 hex digits"},
		{"unknown role", hashLine("a", "acme alice reader,superuser"), `line 1: unknown role "superuser"`},
		{"duplicate", hashLine("a", "acme alice reader") + "\n" + hashLine("a", "beta bob writer"), "line 2: the same token hash is listed twice"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.ParseTokens(strings.NewReader(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// Every AgentService RPC has a rule: a new RPC cannot be served before
// someone decides who may call it.
func TestEveryAgentRPCHasARole(t *testing.T) {
	t.Parallel()
	sd := agentv1.AgentService_ServiceDesc
	var methods []string
	for _, m := range sd.Methods {
		methods = append(methods, "/"+sd.ServiceName+"/"+m.MethodName)
	}
	for _, s := range sd.Streams {
		methods = append(methods, "/"+sd.ServiceName+"/"+s.StreamName)
	}
	for _, m := range methods {
		if _, ok := auth.AgentServiceRoles[m]; !ok {
			t.Errorf("%s has no role in auth.AgentServiceRoles", m)
		}
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	readerRPCs := []string{"GetSession", "ListSessions", "StreamEvents", "GetMessages", "WaitIdle"}
	writerRPCs := []string{"CreateSession", "Send", "Steer", "Inject", "Cancel", "ForkSession", "Respond", "UpdateSession", "Compact"}
	m := func(rpc string) string { return "/dsh.agent.v1.AgentService/" + rpc }
	principals := map[string]auth.Principal{
		"none":   {Tenant: "a", Subject: "n"},
		"reader": {Tenant: "a", Subject: "r", Roles: []auth.Role{auth.RoleReader}},
		"writer": {Tenant: "a", Subject: "w", Roles: []auth.Role{auth.RoleWriter}},
		"admin":  {Tenant: "a", Subject: "x", Roles: []auth.Role{auth.RoleAdmin}},
	}
	allowed := map[string]map[string]bool{"none": {}, "reader": {}, "writer": {}, "admin": {}}
	for _, r := range readerRPCs {
		allowed["reader"][r], allowed["writer"][r], allowed["admin"][r] = true, true, true
	}
	for _, r := range writerRPCs {
		allowed["writer"][r], allowed["admin"][r] = true, true
	}
	var az auth.Roles
	for name, p := range principals {
		for _, rpc := range append(append([]string{}, readerRPCs...), writerRPCs...) {
			err := az.Authorize(t.Context(), p, auth.Target{FullMethod: m(rpc), SessionID: "s"})
			if got := err == nil; got != allowed[name][rpc] {
				t.Errorf("%s %s: allowed = %v, want %v (%v)", name, rpc, got, allowed[name][rpc], err)
			}
		}
	}
	if err := az.Authorize(t.Context(), principals["admin"], auth.Target{FullMethod: "/dsh.agent.v1.AgentService/Unknown"}); err == nil {
		t.Error("an RPC without a rule was allowed")
	}
	if err := az.Authorize(t.Context(), principals["writer"], auth.Target{FullMethod: m("ListSessions"), Tenant: "b"}); err == nil {
		t.Error("a writer listed another tenant")
	}
	if err := az.Authorize(t.Context(), principals["admin"], auth.Target{FullMethod: m("ListSessions"), Tenant: "b"}); err != nil {
		t.Errorf("an admin could not list another tenant: %v", err)
	}
}

type countDenials struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countDenials) RecordDenial(_ context.Context, rpc, code string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[rpc+" "+code]++
}

func (c *countDenials) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// recordingAgent answers every RPC it is reached with, recording the
// principal the edge put in the context.
type recordingAgent struct {
	agentv1.UnimplementedAgentServiceServer
	got chan auth.Principal
}

func (r *recordingAgent) GetSession(ctx context.Context, _ *agentv1.GetSessionRequest) (*agentv1.GetSessionResponse, error) {
	p, _ := auth.FromContext(ctx)
	r.got <- p
	return &agentv1.GetSessionResponse{}, nil
}

func (r *recordingAgent) StreamEvents(_ *agentv1.StreamEventsRequest, s grpc.ServerStreamingServer[agentv1.StreamEventsResponse]) error {
	p, _ := auth.FromContext(s.Context())
	r.got <- p
	return nil
}

// The edge over real gRPC: codes, the principal in the handler's context,
// the health service left open, denials logged without the token and
// counted.
func TestEdgeOverGRPC(t *testing.T) {
	t.Parallel()
	toks, err := auth.ParseTokens(strings.NewReader(hashLine("secret-reader-token", "acme rita reader") + "\n" + hashLine("secret-norole-token", "acme nora reader")))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	counter := &countDenials{}
	edge := auth.NewEdge(auth.EdgeConfig{Authn: toks, Denials: counter, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	gs := grpc.NewServer(edge.ServerOptions()...)
	rec := &recordingAgent{got: make(chan auth.Principal, 4)}
	agentv1.RegisterAgentServiceServer(gs, rec)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := agentv1.NewAgentServiceClient(conn)
	with := func(v string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), "authorization", v)
	}

	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health without credentials: %v", err)
	}
	cases := []struct {
		name string
		ctx  context.Context
		call func(ctx context.Context) error
		code codes.Code
	}{
		{"no token", t.Context(), func(ctx context.Context) error {
			_, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "s1"})
			return err
		}, codes.Unauthenticated},
		{"basic scheme", with("Basic c2VjcmV0"), func(ctx context.Context) error {
			_, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "s1"})
			return err
		}, codes.Unauthenticated},
		{"unknown token", with("Bearer secret-wrong-token"), func(ctx context.Context) error {
			_, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "s1"})
			return err
		}, codes.Unauthenticated},
		{"reader sends", with("Bearer secret-reader-token"), func(ctx context.Context) error {
			_, err := c.Send(ctx, &agentv1.SendRequest{SessionId: "s1"})
			return err
		}, codes.PermissionDenied},
		{"reader lists another tenant", with("Bearer secret-reader-token"), func(ctx context.Context) error {
			_, err := c.ListSessions(ctx, &agentv1.ListSessionsRequest{Tenant: "beta"})
			return err
		}, codes.PermissionDenied},
		{"reader reads", with("bearer secret-reader-token"), func(ctx context.Context) error {
			_, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "s1"})
			return err
		}, codes.OK},
		{"reader streams", with("Bearer secret-reader-token"), func(ctx context.Context) error {
			s, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "s1"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			if err != nil && err.Error() == "EOF" {
				return nil
			}
			return err
		}, codes.OK},
		{"stream without token", t.Context(), func(ctx context.Context) error {
			s, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "s1"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.Unauthenticated},
	}
	for _, tc := range cases {
		err := tc.call(tc.ctx)
		if got := status.Code(err); got != tc.code {
			t.Errorf("%s: code %s (%v), want %s", tc.name, got, err, tc.code)
		}
		if tc.code == codes.OK {
			if p := <-rec.got; p.Tenant != "acme" || p.Subject != "rita" {
				t.Errorf("%s: principal in the handler = %+v", tc.name, p)
			}
		}
	}
	out := logs.String()
	for _, secret := range []string{"secret-reader-token", "secret-wrong-token", "c2VjcmV0"} {
		if strings.Contains(out, secret) {
			t.Fatalf("a credential reached the log:\n%s", out)
		}
	}
	if !strings.Contains(out, "rpc=/dsh.agent.v1.AgentService/Send") || !strings.Contains(out, "session=s1") || !strings.Contains(out, "subject=rita") {
		t.Fatalf("the Send denial is not logged with rpc, session and principal:\n%s", out)
	}
	for k, want := range map[string]int{
		"/dsh.agent.v1.AgentService/GetSession Unauthenticated":    3,
		"/dsh.agent.v1.AgentService/Send PermissionDenied":         1,
		"/dsh.agent.v1.AgentService/ListSessions PermissionDenied": 1,
		"/dsh.agent.v1.AgentService/StreamEvents Unauthenticated":  1,
	} {
		if got := counter.get(k); got != want {
			t.Errorf("denials[%s] = %d, want %d (all: %v)", k, got, want, fmt.Sprint(counter.n))
		}
	}
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr                             string
		plaintext, unauthenticated, insc bool
		wantErr                          string
	}{
		{"127.0.0.1:7700", true, true, false, ""},
		{"localhost:7700", true, true, false, ""},
		{"[::1]:7700", true, true, false, ""},
		{"0.0.0.0:7700", false, false, false, ""},
		{"0.0.0.0:7700", true, false, false, "without TLS"},
		{":7702", true, false, false, "without TLS"},
		{"10.0.0.5:7700", false, true, false, "without client authentication"},
		{"agent.svc:7700", true, true, false, "without TLS (--tls-cert/--tls-key) and without client authentication"},
		{"0.0.0.0:7700", true, true, true, ""},
	} {
		err := auth.CheckListen(tc.addr, tc.plaintext, tc.unauthenticated, tc.insc, slog.New(slog.DiscardHandler))
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.addr, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--insecure") || strings.Contains(err.Error(), "\n")):
			t.Errorf("%s: err = %v, want one line with %q naming --insecure", tc.addr, err, tc.wantErr)
		}
	}
}

// TestFlagsFromEnv: the flags default from their variables; a flag given
// wins; a variable whose value does not parse is an error naming it (even
// when its flag is given), never its default in silence.
func TestFlagsFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		env                  map[string]string
		args                 []string
		wantInsecure         bool
		wantSkew, wantReload time.Duration
		wantPeers            []string
		wantErr              string // "" = none
	}{
		{name: "unset", wantSkew: time.Minute, wantReload: 5 * time.Minute},
		{name: "empty", env: map[string]string{auth.EnvInsecure: "", auth.EnvJWTClockSkew: "", auth.EnvJWTRefresh: ""}, wantSkew: time.Minute, wantReload: 5 * time.Minute},
		{name: "set", env: map[string]string{auth.EnvInsecure: "1", auth.EnvJWTClockSkew: "30s", auth.EnvJWTRefresh: "600", auth.EnvAllowPeer: "a, b"},
			wantInsecure: true, wantSkew: 30 * time.Second, wantReload: 10 * time.Minute, wantPeers: []string{"a", "b"}},
		{name: "insecure false means false", env: map[string]string{auth.EnvInsecure: "false"}, wantSkew: time.Minute, wantReload: 5 * time.Minute},
		{name: "flags win", env: map[string]string{auth.EnvInsecure: "true", auth.EnvJWTClockSkew: "30s"}, args: []string{"--insecure=false", "--jwt-clock-skew", "2s"},
			wantSkew: 2 * time.Second, wantReload: 5 * time.Minute},
		{name: "bad boolean", env: map[string]string{auth.EnvInsecure: "sure"}, wantSkew: time.Minute, wantReload: 5 * time.Minute,
			wantErr: `DSH_INSECURE="sure": not a boolean`},
		{name: "bad duration", env: map[string]string{auth.EnvJWTClockSkew: "a minute"}, wantSkew: time.Minute, wantReload: 5 * time.Minute,
			wantErr: `DSH_JWT_CLOCK_SKEW="a minute": not a duration`},
		{name: "bad duration under its flag", env: map[string]string{auth.EnvJWTRefresh: "hourly"}, args: []string{"--jwt-jwks-refresh", "1h"}, wantSkew: time.Minute, wantReload: time.Hour,
			wantErr: `DSH_JWT_REFRESH="hourly": not a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			env := cmdline.NewEnv(func(k string) string { return tc.env[k] })
			var sf auth.ServerFlags
			var af auth.AuthFlags
			sf.RegisterFlags(fs, env)
			sf.RegisterPeerFlag(fs, env)
			af.RegisterFlags(fs, env)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if sf.Insecure != tc.wantInsecure || af.JWT.ClockSkew != tc.wantSkew || af.JWT.Refresh != tc.wantReload || !slices.Equal(sf.AllowPeers, tc.wantPeers) {
				t.Errorf("insecure %v, clock skew %v, refresh %v, peers %q; want %v, %v, %v, %q",
					sf.Insecure, af.JWT.ClockSkew, af.JWT.Refresh, sf.AllowPeers, tc.wantInsecure, tc.wantSkew, tc.wantReload, tc.wantPeers)
			}
			if err := env.Err(); (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("variables' error %v, want %q", err, tc.wantErr)
			}
		})
	}
}
