package e2e

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
)

const (
	agentSPIFFE = "spiffe://dsh/agent"
	jwtIssuer   = "https://issuer.dsh.test"
	jwtAudience = "dsh-agent"
)

// secureStack is the three services run apart with mTLS between them and
// JWT authentication on the agent.
type secureStack struct {
	stack
	ca                        *authtest.CA
	toolhostCert, agentClient authtest.Pair
	issuer                    *authtest.Issuer
}

func tlsDial(t *testing.T, c auth.ClientTLS) grpc.DialOption {
	t.Helper()
	creds, err := auth.ClientCredentials(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return grpcserver.WithCredentials(grpc.WithTransportCredentials(creds))
}

func startSecureStack(t *testing.T) *secureStack {
	t.Helper()
	pki := t.TempDir()
	s := &secureStack{stack: stack{t: t, dataDir: t.TempDir(), workspace: t.TempDir()}}
	s.ca = authtest.NewCA(t, pki, "dsh")
	gw := s.ca.Issue(t, "gateway", authtest.Loopback("spiffe://dsh/gateway"))
	s.toolhostCert = s.ca.Issue(t, "toolhost", authtest.Loopback("spiffe://dsh/toolhost"))
	agentSrv := s.ca.Issue(t, "agent", authtest.Loopback(agentSPIFFE))
	s.agentClient = s.ca.Issue(t, "agent-client", authtest.Identity{CommonName: "agent", URIs: []string{agentSPIFFE}, Client: true})
	s.issuer = authtest.NewIssuer(t, jose.EdDSA, "e2e-1")
	jwks := filepath.Join(pki, "jwks.json")
	if err := os.WriteFile(jwks, authtest.JWKS(t, s.issuer), 0o600); err != nil {
		t.Fatal(err)
	}

	s.gatewayAddr, s.toolhostAddr, s.agentAddr = freeAddr(t), freeAddr(t), freeAddr(t)
	mtls := func(p authtest.Pair) []string {
		return []string{"--tls-cert", p.Cert, "--tls-key", p.Key, "--tls-client-ca", s.ca.CAFile, "--allow-peer", agentSPIFFE}
	}
	s.gateway = start(t, "llmgateway", cleanEnv("DSH_SCRIPT="+script), append([]string{"--listen", s.gatewayAddr}, mtls(gw)...)...)
	s.toolhost = start(t, "toolhost", cleanEnv(), append([]string{"--listen", s.toolhostAddr, "--workspace", s.workspace}, mtls(s.toolhostCert)...)...)
	asAgent := tlsDial(t, auth.ClientTLS{CA: s.ca.CAFile, Cert: s.agentClient.Cert, Key: s.agentClient.Key})
	waitServing(t, s.gatewayAddr, s.gateway, asAgent)
	waitServing(t, s.toolhostAddr, s.toolhost, asAgent)
	// The agent: TLS for its clients (who authenticate with JWTs), its
	// client certificate for the gateway and the toolhost. Everything from
	// the environment twins except the listen flags.
	s.agent = start(t, "agent", cleanEnv(
		"DSH_TLS_CERT="+agentSrv.Cert, "DSH_TLS_KEY="+agentSrv.Key,
		"DSH_TLS_CA="+s.ca.CAFile, "DSH_TLS_CLIENT_CERT="+s.agentClient.Cert, "DSH_TLS_CLIENT_KEY="+s.agentClient.Key,
		"DSH_AUTH=jwt", "DSH_JWT_JWKS="+jwks, "DSH_JWT_ISSUER="+jwtIssuer, "DSH_JWT_AUDIENCE="+jwtAudience,
	), "--listen", s.agentAddr, "--gateway", s.gatewayAddr, "--toolhost", "builtin="+s.toolhostAddr, "--data", s.dataDir,
		"--approval-rule", "*=allow") // nobody answers approvals here
	caOnly := tlsDial(t, auth.ClientTLS{CA: s.ca.CAFile})
	waitServing(t, s.agentAddr, s.agent, caOnly)
	conn, err := grpcserver.Dial(s.agentAddr, caOnly)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn, s.client = conn, agentv1.NewAgentServiceClient(conn)
	return s
}

// token is a JWT of tenant with roles, valid for an hour.
func (s *secureStack) token(tenant string, roles ...string) string {
	return s.issuer.Sign(s.t, authtest.Valid(jwtIssuer, jwtAudience, tenant+"-user", tenant, roles...))
}

func bearer(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func serverSerial(t *testing.T, addr string, dial grpc.DialOption) *x509.Certificate {
	t.Helper()
	conn, err := grpcserver.Dial(addr, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return authtest.ServerCertificate(t, conn)
}

// The done-when of issue 11: the services run apart with mTLS and JWT auth,
// a client of tenant A drives a session while tenant B's probes fail, and
// the toolhost refuses anything but the agent.
func TestSecureStack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	s := startSecureStack(t)
	acme := bearer(ctx, s.token("acme", "writer"))

	// Tenant acme drives a session end to end: agent -> gateway and agent ->
	// toolhost over mTLS (the scripted model runs two bash calls).
	resp, err := s.client.CreateSession(acme, &agentv1.CreateSessionRequest{Cwd: s.workspace,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted", WorkspaceRoot: s.workspace}})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	id := resp.GetSession().GetHeader().GetId()
	if got := resp.GetSession().GetHeader().GetTenant(); got != "acme" {
		t.Fatalf("tenant = %q", got)
	}
	checkTurn(t, s.runTurn(acme, id, 0, "run the two commands"), 0)

	// Tenant beta cannot see it; no token is UNAUTHENTICATED.
	beta := bearer(ctx, s.token("beta", "writer", "reader"))
	if _, err := s.client.GetSession(beta, &agentv1.GetSessionRequest{SessionId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("beta GetSession: %v, want NotFound", err)
	}
	if _, err := s.client.Send(beta, &agentv1.SendRequest{SessionId: id, Content: textBlocks("hi")}); status.Code(err) != codes.NotFound {
		t.Errorf("beta Send: %v, want NotFound", err)
	}
	if l, err := s.client.ListSessions(beta, &agentv1.ListSessionsRequest{}); err != nil || len(l.GetSessions()) != 0 {
		t.Errorf("beta ListSessions: %v %v", l, err)
	}
	if _, err := s.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", err)
	}
	if _, err := s.client.Send(bearer(ctx, s.token("acme", "reader")), &agentv1.SendRequest{SessionId: id, Content: textBlocks("hi")}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("acme reader Send: %v, want PermissionDenied", err)
	}

	// The toolhost refuses direct callers: no certificate, a certificate
	// of the right CA with another identity, a certificate of another CA.
	intruder := s.ca.Issue(t, "intruder", authtest.Identity{URIs: []string{"spiffe://dsh/intruder"}, Client: true})
	other := authtest.NewCA(t, t.TempDir(), "other")
	foreign := other.Issue(t, "foreign", authtest.Identity{URIs: []string{agentSPIFFE}, Client: true})
	for _, tc := range []struct {
		name string
		tls  auth.ClientTLS
		code codes.Code
	}{
		{"no client certificate", auth.ClientTLS{CA: s.ca.CAFile}, codes.Unavailable},
		{"wrong identity", auth.ClientTLS{CA: s.ca.CAFile, Cert: intruder.Cert, Key: intruder.Key}, codes.PermissionDenied},
		{"another CA", auth.ClientTLS{CA: s.ca.CAFile, Cert: foreign.Cert, Key: foreign.Key}, codes.Unavailable},
	} {
		conn, err := grpcserver.Dial(s.toolhostAddr, tlsDial(t, tc.tls))
		if err != nil {
			t.Fatal(err)
		}
		ex := &toolsv1.ToolExecution{CallId: "x", Name: "bash", Arguments: `{"command":"id"}`, Context: &toolsv1.ToolContext{SessionId: "x", Cwd: s.workspace}}
		st, err := toolsv1.NewToolHostClient(conn).Execute(ctx, &toolsv1.ExecuteRequest{Execution: ex})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != tc.code {
			t.Errorf("toolhost, %s: %v, want %s", tc.name, err, tc.code)
		}
		// PrepareExecute is refused the same way, before it prepares.
		got, err := toolhostconformance.Exchange(ctx, toolsv1.NewToolHostClient(conn),
			toolhostconformance.Prepare(ex), toolhostconformance.Execute(ex))
		conn.Close()
		if status.Code(err) != tc.code || len(got) != 0 {
			t.Errorf("toolhost PrepareExecute, %s: %v after %v, want %s and no message", tc.name, err, got, tc.code)
		}
	}

	// The toolhost's certificate rotates on disk: a new connection gets the
	// new one, and the agent's established connection (its WatchTools
	// stream) carries the next turn.
	asAgent := tlsDial(t, auth.ClientTLS{CA: s.ca.CAFile, Cert: s.agentClient.Cert, Key: s.agentClient.Key})
	before := serverSerial(t, s.toolhostAddr, asAgent)
	rotated := s.ca.IssueTo(t, s.toolhostCert, authtest.Loopback("spiffe://dsh/toolhost"))
	if after := serverSerial(t, s.toolhostAddr, asAgent); after.SerialNumber.Cmp(rotated.SerialNumber) != 0 || after.SerialNumber.Cmp(before.SerialNumber) == 0 {
		t.Fatalf("after rotation the toolhost presents serial %v, want %v", after.SerialNumber, rotated.SerialNumber)
	}
	g, err := s.client.GetSession(acme, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	from := g.GetSession().GetNextSeq()
	checkTurn(t, s.runTurn(acme, id, from, "again"), from)

	// The CLI: --tls-ca and --token (the env twins work the same way).
	out, errOut, code := dsh(t, "sessions", "list", "--addr", s.agentAddr, "--tls-ca", s.ca.CAFile, "--token", s.token("acme", "reader"), "--json")
	if code != 0 || !strings.Contains(out, id) {
		t.Errorf("dsh sessions list as acme: exit %d, out %q, err %q", code, out, errOut)
	}
	out, errOut, code = dsh(t, "sessions", "list", "--addr", s.agentAddr, "--tls-ca", s.ca.CAFile, "--token", s.token("beta", "reader"), "--json")
	if code != 0 || strings.Contains(out, id) {
		t.Errorf("dsh sessions list as beta: exit %d, out %q, err %q", code, out, errOut)
	}
	_, errOut, code = dsh(t, "sessions", "list", "--addr", s.agentAddr, "--tls-ca", s.ca.CAFile)
	if code == 0 || !strings.Contains(errOut, "missing credentials") {
		t.Errorf("dsh sessions list without a token: exit %d, err %q", code, errOut)
	}
}

// Safe defaults: a non-loopback listener without TLS, or the agent without
// authentication, refuses to start with one line naming --insecure, also
// with DSH_INSECURE set to a false form; --insecure (or DSH_INSECURE set to
// a true form) starts it with a WARN; a DSH_INSECURE that is neither stops
// it naming the variable.
func TestSafeDefaults(t *testing.T) {
	t.Parallel()
	pki := t.TempDir()
	ca := authtest.NewCA(t, pki, "dsh")
	srv := ca.Issue(t, "srv", authtest.Loopback())
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		bin  string
		env  []string
		args []string
		want string
	}{
		{"toolhost plaintext", "toolhost", nil, []string{"--listen", "0.0.0.0:0", "--workspace", dir}, "without TLS"},
		{"gateway plaintext", "llmgateway", nil, []string{"--listen", "0.0.0.0:0"}, "without TLS"},
		{"agent with TLS but --auth none", "agent", nil, []string{"--listen", "0.0.0.0:0", "--data", dir, "--tls-cert", srv.Cert, "--tls-key", srv.Key}, "without client authentication"},
		{"agent, bad token file", "agent", nil, []string{"--listen", "127.0.0.1:0", "--data", dir, "--auth", "token", "--auth-tokens", writeFile(t, dir, "tokens", "# ok\nsha256:00 acme alice reader\n")}, "line 2"},
		// DSH_INSECURE is a boolean: its false forms keep the refusal (any
		// non-empty value once meant insecure), a value that is none stops
		// the binary naming the variable.
		{"toolhost plaintext, DSH_INSECURE=false", "toolhost", []string{"DSH_INSECURE=false"}, []string{"--listen", "0.0.0.0:0", "--workspace", dir}, "without TLS"},
		{"gateway plaintext, DSH_INSECURE=0", "llmgateway", []string{"DSH_INSECURE=0"}, []string{"--listen", "0.0.0.0:0"}, "without TLS"},
		{"agent with TLS but --auth none, DSH_INSECURE=off", "agent", []string{"DSH_INSECURE=off"}, []string{"--listen", "0.0.0.0:0", "--data", dir, "--tls-cert", srv.Cert, "--tls-key", srv.Key}, "without client authentication"},
		{"toolhost, DSH_INSECURE=maybe", "toolhost", []string{"DSH_INSECURE=maybe"}, []string{"--listen", "0.0.0.0:0", "--workspace", dir}, `DSH_INSECURE="maybe"`},
		{"gateway, DSH_INSECURE=maybe", "llmgateway", []string{"DSH_INSECURE=maybe"}, []string{"--listen", "0.0.0.0:0"}, `DSH_INSECURE="maybe"`},
		{"agent, DSH_INSECURE=maybe", "agent", []string{"DSH_INSECURE=maybe"}, []string{"--listen", "0.0.0.0:0", "--data", dir}, `DSH_INSECURE="maybe"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := start(t, tc.bin, cleanEnv(tc.env...), tc.args...)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s did not refuse to start:\n%s", tc.bin, p.out.String())
			}
			out := strings.TrimSpace(p.out.String())
			if p.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(out, tc.want) || strings.Contains(out, "\n") {
				t.Fatalf("exit %d, output %q: want one line containing %q", p.cmd.ProcessState.ExitCode(), out, tc.want)
			}
			if !strings.HasPrefix(tc.name, "agent, bad") && !strings.Contains(tc.name, "maybe") && !strings.Contains(out, "--insecure") {
				t.Fatalf("the refusal does not name --insecure: %q", out)
			}
		})
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"--insecure", nil, []string{"--insecure"}},
		{"DSH_INSECURE=yes", []string{"DSH_INSECURE=yes"}, nil},
		{"DSH_INSECURE=TRUE", []string{"DSH_INSECURE=TRUE"}, nil},
	} {
		t.Run("insecure starts with a warning, "+tc.name, func(t *testing.T) {
			t.Parallel()
			addr := "0.0.0.0:" + strings.Split(freeAddr(t), ":")[1]
			p := start(t, "toolhost", cleanEnv(tc.env...), append([]string{"--listen", addr, "--workspace", dir}, tc.args...)...)
			waitServing(t, "127.0.0.1:"+strings.Split(addr, ":")[1], p)
			if !strings.Contains(p.out.String(), "level=WARN msg=\"INSECURE") {
				t.Fatalf("no WARN line:\n%s", p.out.String())
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
