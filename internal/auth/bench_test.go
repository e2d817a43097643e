package auth_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
)

// BenchmarkEdgeJWT is the cost the agent's edge adds to one unary RPC with
// --auth jwt: read the metadata, verify the token's signature with the
// cached key, check the claims, build the principal, authorize the RPC.
// Target: <= 20 µs median. "cached" is the steady state of a client reusing
// its token (the verified-token cache answers); "verify" checks the
// signature on every call (cache disabled), the cost of a token's first RPC.
func BenchmarkEdgeJWT(b *testing.B) {
	for _, mode := range []struct {
		name  string
		cache int
	}{{"cached", 0}, {"verify", -1}} {
		for _, alg := range []jose.SignatureAlgorithm{jose.EdDSA, jose.ES256, jose.RS256} {
			b.Run(mode.name+"/"+string(alg), func(b *testing.B) {
				iss := authtest.NewIssuer(b, alg, "k1")
				path := filepath.Join(b.TempDir(), "jwks.json")
				if err := os.WriteFile(path, authtest.JWKS(b, iss), 0o600); err != nil {
					b.Fatal(err)
				}
				j, err := auth.NewJWT(b.Context(), auth.JWTConfig{JWKS: path, Issuer: testIss, Audience: testAud, CacheSize: mode.cache})
				if err != nil {
					b.Fatal(err)
				}
				defer j.Close()
				benchEdge(b, j, iss.Sign(b, authtest.Valid(testIss, testAud, "alice", "acme", "writer")))
			})
		}
	}
	b.Run("token", func(b *testing.B) {
		toks, err := auth.ParseTokens(strings.NewReader(hashLine("opaque-token", "acme alice writer")))
		if err != nil {
			b.Fatal(err)
		}
		benchEdge(b, toks, "opaque-token")
	})
}

func benchEdge(b *testing.B, authn auth.Authenticator, tok string) {
	edge := auth.NewEdge(auth.EdgeConfig{Authn: authn, Logger: slog.New(slog.DiscardHandler)})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	info := &grpc.UnaryServerInfo{FullMethod: agentv1.AgentService_Send_FullMethodName}
	req := &agentv1.SendRequest{SessionId: "s1"}
	h := func(ctx context.Context, _ any) (any, error) {
		if _, ok := auth.FromContext(ctx); !ok {
			b.Fatal("no principal")
		}
		return nil, nil
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := edge.Unary(ctx, req, info, h); err != nil {
			b.Fatal(err)
		}
	}
}
