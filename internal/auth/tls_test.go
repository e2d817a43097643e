package auth_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
)

const agentID = "spiffe://dsh/agent"

// pki is a CA, a server certificate and client certificates, on disk.
type pki struct {
	dir    string
	ca     *authtest.CA
	server authtest.Pair
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	ca := authtest.NewCA(t, dir, "dsh")
	return &pki{dir: dir, ca: ca, server: ca.Issue(t, "server", authtest.Loopback())}
}

// serveTLS serves health and a ToolHost (unimplemented: reaching it is
// Unimplemented, refusing it is PermissionDenied) with the server flags f.
func serveTLS(t *testing.T, f auth.ServerFlags) (string, *health.Server) {
	t.Helper()
	opts, err := f.ServerOptions(auth.Options{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	toolsv1.RegisterToolHostServer(gs, toolsv1.UnimplementedToolHostServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), hs
}

func dialTLS(t *testing.T, addr string, c auth.ClientTLS) *grpc.ClientConn {
	t.Helper()
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if c.Enabled() {
		var err error
		if creds, err = auth.ClientCredentials(c, nil); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func listTools(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
	_, err := toolsv1.NewToolHostClient(conn).ListTools(ctx, &toolsv1.ListToolsRequest{}, opts...)
	return err
}

func TestMutualTLSPeers(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	addr, _ := serveTLS(t, auth.ServerFlags{
		TLS:        auth.ServerTLS{Cert: p.server.Cert, Key: p.server.Key, ClientCA: p.ca.CAFile},
		AllowPeers: []string{agentID, "agent.dsh.svc"},
	})
	agent := p.ca.Issue(t, "agent", authtest.Identity{URIs: []string{agentID}, Client: true})
	agentDNS := p.ca.Issue(t, "agent-dns", authtest.Identity{DNS: []string{"Agent.dsh.svc"}, Client: true})
	intruder := p.ca.Issue(t, "intruder", authtest.Identity{URIs: []string{"spiffe://dsh/toolhost"}, DNS: []string{"toolhost.dsh.svc"}, Client: true})
	other := authtest.NewCA(t, p.dir, "other")
	foreign := other.Issue(t, "foreign", authtest.Identity{URIs: []string{agentID}, Client: true})

	for _, tc := range []struct {
		name   string
		client auth.ClientTLS
		code   codes.Code
		msg    string
	}{
		{"agent by URI SAN", auth.ClientTLS{CA: p.ca.CAFile, Cert: agent.Cert, Key: agent.Key}, codes.Unimplemented, ""},
		{"agent by DNS SAN", auth.ClientTLS{CA: p.ca.CAFile, Cert: agentDNS.Cert, Key: agentDNS.Key}, codes.Unimplemented, ""},
		{"same CA, wrong identity", auth.ClientTLS{CA: p.ca.CAFile, Cert: intruder.Cert, Key: intruder.Key}, codes.PermissionDenied, "spiffe://dsh/toolhost"},
		{"no client certificate", auth.ClientTLS{CA: p.ca.CAFile}, codes.Unavailable, ""},
		{"certificate of another CA", auth.ClientTLS{CA: p.ca.CAFile, Cert: foreign.Cert, Key: foreign.Key}, codes.Unavailable, ""},
		{"plaintext", auth.ClientTLS{}, codes.Unavailable, ""},
		{"client does not trust the server", auth.ClientTLS{CA: other.CAFile, Cert: agent.Cert, Key: agent.Key}, codes.Unavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := listTools(ctx, dialTLS(t, addr, tc.client))
			if got := status.Code(err); got != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("code %s (%v), want %s containing %q", got, err, tc.code, tc.msg)
			}
		})
	}
}

func TestAllowPeerNeedsClientCA(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	_, err := auth.ServerFlags{TLS: auth.ServerTLS{Cert: p.server.Cert, Key: p.server.Key}, AllowPeers: []string{agentID}}.
		ServerOptions(auth.Options{Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "--tls-client-ca") {
		t.Fatalf("err = %v", err)
	}
	_, err = auth.ServerFlags{TLS: auth.ServerTLS{Cert: p.server.Cert}}.ServerOptions(auth.Options{Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Fatalf("err = %v", err)
	}
	_, err = auth.ServerFlags{TLS: auth.ServerTLS{Cert: p.server.Cert, Key: p.server.Key, ClientCA: filepath.Join(p.dir, "nope.pem")}}.
		ServerOptions(auth.Options{Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "--tls-client-ca") {
		t.Fatalf("err = %v", err)
	}
}

// Certificates rotated on disk (server and client) are used by the next
// handshake, and a stream opened before the rotation keeps flowing.
func TestRotation(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	addr, hs := serveTLS(t, auth.ServerFlags{
		TLS:        auth.ServerTLS{Cert: p.server.Cert, Key: p.server.Key, ClientCA: p.ca.CAFile},
		AllowPeers: []string{agentID},
	})
	client := p.ca.Issue(t, "client", authtest.Identity{URIs: []string{agentID}, Client: true})
	ctls := auth.ClientTLS{CA: p.ca.CAFile, Cert: client.Cert, Key: client.Key}

	old := dialTLS(t, addr, ctls)
	before := authtest.ServerCertificate(t, old)
	watch, err := healthpb.NewHealthClient(old).Watch(t.Context(), &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil { // SERVICE_UNKNOWN
		t.Fatal(err)
	}

	// A half-written rotation does not load: the previous certificate stays
	// in use.
	if err := os.WriteFile(p.server.Cert, []byte("-----BEGIN CERTIFICATE-----\ntrunc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := authtest.ServerCertificate(t, dialTLS(t, addr, ctls)); got.SerialNumber.Cmp(before.SerialNumber) != 0 {
		t.Fatalf("after a broken write the server presents serial %v, want the previous %v", got.SerialNumber, before.SerialNumber)
	}

	// The server's certificate rotates; so does the client's, into an
	// identity the server does not admit.
	rotated := p.ca.IssueTo(t, p.server, authtest.Loopback())
	p.ca.IssueTo(t, client, authtest.Identity{URIs: []string{"spiffe://dsh/retired"}, Client: true})

	fresh := dialTLS(t, addr, ctls)
	after := authtest.ServerCertificate(t, fresh)
	if after.SerialNumber.Cmp(rotated.SerialNumber) != 0 || after.SerialNumber.Cmp(before.SerialNumber) == 0 {
		t.Fatalf("new connection got serial %v, want the rotated %v (old %v)", after.SerialNumber, rotated.SerialNumber, before.SerialNumber)
	}
	if err := listTools(t.Context(), fresh); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "spiffe://dsh/retired") {
		t.Fatalf("rotated client identity: %v, want PermissionDenied naming it", err)
	}
	// The stream opened before the rotation still carries updates.
	hs.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	resp, err := watch.Recv()
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("old stream after rotation: %v %v", resp, err)
	}
	// And the old connection keeps its (old, admitted) identity.
	if err := listTools(t.Context(), old); status.Code(err) != codes.Unimplemented {
		t.Fatalf("old connection after rotation: %v", err)
	}
}
