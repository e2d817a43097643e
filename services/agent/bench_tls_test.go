package agent_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/agent"
)

// BenchmarkStepMTLS is BenchmarkStep (sync=NORMAL, at=100) with the agent's
// connections to the gateway and the toolhost in plaintext ("off") and in
// mTLS with the peer check on both servers ("on"); the agent's own
// listener serves TLS too. Target: on/off <= 1.15.
func BenchmarkStepMTLS(b *testing.B) {
	for _, mtls := range []bool{false, true} {
		name := "mtls=off"
		if mtls {
			name = "mtls=on"
		}
		b.Run(name, func(b *testing.B) {
			var srvOpts []grpc.ServerOption
			sc := agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL"}
			clientCreds := grpc.WithTransportCredentials(insecure.NewCredentials())
			if mtls {
				dir := b.TempDir()
				ca := authtest.NewCA(b, dir, "bench")
				srv := ca.Issue(b, "srv", authtest.Loopback())
				cli := ca.Issue(b, "agent", authtest.Identity{URIs: []string{"spiffe://dsh/agent"}, Client: true})
				var err error
				srvOpts, err = auth.ServerFlags{TLS: auth.ServerTLS{Cert: srv.Cert, Key: srv.Key, ClientCA: ca.CAFile},
					AllowPeers: []string{"spiffe://dsh/agent"}}.ServerOptions(auth.Options{Listen: "127.0.0.1:0"})
				if err != nil {
					b.Fatal(err)
				}
				dial, err := auth.ClientCredentials(auth.ClientTLS{CA: ca.CAFile, Cert: cli.Cert, Key: cli.Key}, nil)
				if err != nil {
					b.Fatal(err)
				}
				sc.DialOptions = []grpc.DialOption{grpcserver.WithCredentials(grpc.WithTransportCredentials(dial))}
				agentSrv, err := auth.ServerFlags{TLS: auth.ServerTLS{Cert: srv.Cert, Key: srv.Key}}.ServerOptions(auth.Options{Listen: "127.0.0.1:0"})
				if err != nil {
					b.Fatal(err)
				}
				sc.ServerOptions = agentSrv
				toAgent, err := auth.ClientCredentials(auth.ClientTLS{CA: ca.CAFile}, nil)
				if err != nil {
					b.Fatal(err)
				}
				clientCreds = grpc.WithTransportCredentials(toAgent)
			}
			benchSteps(b, 100, srvOpts, sc, clientCreds)
		})
	}
}
