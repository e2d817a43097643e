package conformance_test

import (
	"crypto/tls"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/testpki"
	"github.com/dsh-dev/dsh/tests/conformance"
	"github.com/dsh-dev/dsh/tests/conformance/hostproc"
)

// TestSDKHostsOverMTLS starts the Python and TypeScript example hosts with
// the environment a deployment gives them (DSH_TLS_CERT, DSH_TLS_KEY,
// DSH_TLS_CLIENT_CA, DSH_ALLOW_PEER=spiffe://dsh/agent), then: a Go client
// with the agent's certificate passes the whole conformance suite over mTLS;
// a client of the same CA with another identity gets PERMISSION_DENIED; a
// client without a certificate never completes the handshake.
func TestSDKHostsOverMTLS(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "dsh")
	srv := ca.Server("host", testpki.Loopback())
	agent := ca.Client("agent", testpki.Names{URIs: []string{"spiffe://dsh/agent"}})
	intruder := ca.Client("intruder", testpki.Names{URIs: []string{"spiffe://dsh/intruder"}})
	env := []string{"DSH_TLS_CERT=" + srv.CertFile, "DSH_TLS_KEY=" + srv.KeyFile,
		"DSH_TLS_CLIENT_CA=" + ca.CertFile, "DSH_ALLOW_PEER=spiffe://dsh/agent"}
	hosts := map[string]func(testing.TB, []string, ...string) string{
		"python":     hostproc.PythonExampleEnv,
		"typescript": hostproc.TypeScriptExampleEnv,
	}
	for name, start := range hosts {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := start(t, env, "--conformance")
			dial := func(leaf *testpki.Leaf) func() (*grpc.ClientConn, error) {
				return func() (*grpc.ClientConn, error) {
					cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
					if leaf != nil {
						cfg.Certificates = []tls.Certificate{leaf.TLS}
					}
					return grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
				}
			}
			t.Run("agent", func(t *testing.T) { conformance.Run(t, dial(agent), conformance.Options{}) })
			for _, tt := range []struct {
				who  string
				leaf *testpki.Leaf
				want codes.Code
			}{{"intruder", intruder, codes.PermissionDenied}, {"no certificate", nil, codes.Unavailable}} {
				t.Run(tt.who, func(t *testing.T) {
					conn, err := dial(tt.leaf)()
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close()
					_, err = toolsv1.NewToolHostClient(conn).ListTools(t.Context(), &toolsv1.ListToolsRequest{})
					if status.Code(err) != tt.want {
						t.Fatalf("ListTools as %s: %v, want %v", tt.who, err, tt.want)
					}
					if tt.want == codes.PermissionDenied && !strings.Contains(err.Error(), "spiffe://dsh/intruder") {
						t.Fatalf("the denial does not name the identity it saw: %v", err)
					}
				})
			}
		})
	}
}
