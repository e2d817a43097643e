package agent_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
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
			var budget atomic.Int64
			gw := budgetGateway(&budget)
			host := fakes.NewToolHost(fakes.Tool{Name: "noop", Run: func(context.Context, *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
				return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{session.Text("ok")}}
			}})
			sc.Gateway = fakes.ServeWith(b, append([]grpc.ServerOption{grpc.ForceServerCodecV2(fakes.SkipHistoryCodec{})}, srvOpts...),
				func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
			sc.Toolhosts = []string{"fake=" + fakes.ServeWith(b, srvOpts, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })}
			c, stop := benchAgentWith(b, sc, clientCreds)
			defer stop()
			if _, err := c.CreateSession(context.Background(), &agentv1.CreateSessionRequest{SessionId: "bench",
				Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}}); err != nil {
				b.Fatal(err)
			}
			budget.Store(100)
			turn(b, c, "bench")
			budget.Store(int64(b.N))
			cpu := cputime.Process()
			b.ResetTimer()
			turn(b, c, "bench")
			b.StopTimer()
			// Process CPU per step (servers, agent and client share the
			// process): steadier than wall time on a shared machine.
			b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
