package grpcserver

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	// ring_hash, registered for SessionAffinity.
	_ "google.golang.org/grpc/balancer/ringhash"
	"google.golang.org/grpc/keepalive"

	"github.com/dsh-dev/dsh/internal/cmdline"
)

// Balancing across replicas (deploy/k8s): a client resolves a name to every
// address behind it (dns:/// of a headless Service lists one address per
// ready pod) and spreads its calls over them with round_robin; a server ends
// each connection after a maximum age so its clients resolve again and reach
// replicas that started since.

// roundRobin is the default service config of every client Dial opens; a
// name with one address behaves as before.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// SessionAffinity is a Dial option that replaces round_robin with ring_hash
// keyed by the request header named header: every call carrying the same
// value reaches the same replica while it is up (the agent's model calls of
// one session reach the gateway replica that remembers the session's
// conversation, docs/arch/llmgateway.md). A replica that fails takes its
// share of the ring to the next replica on it; a call without the header
// goes to a random ready replica.
//
// ring_hash connects lazily: a call whose replica is not connected yet
// (IDLE) starts the connection and is queued by the balancer until it is
// ready or has failed (then the call moves on along the ring), so no call
// fails for being first. The ring holds 1,024 points: at a few replicas each
// owns about as many as the others (a few percent apart), and a pick is a
// binary search over them; it is built again only when the name's address
// list changes.
//
// gRPC can be told to ignore requestHashHeader (the environment variable
// GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY=false); ring_hash would
// then fail every call, so the connection stays round_robin instead.
func SessionAffinity(header string) grpc.DialOption {
	if strings.EqualFold(os.Getenv(ringHashHeaderEnv), "false") {
		return grpc.WithDefaultServiceConfig(roundRobin)
	}
	return grpc.WithDefaultServiceConfig(fmt.Sprintf(ringHash, header))
}

// ringHashHeaderEnv turns gRPC's support of requestHashHeader off when
// "false" (read once by gRPC at start; here at every SessionAffinity).
const ringHashHeaderEnv = "GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY"

const ringHash = `{"loadBalancingConfig":[{"ring_hash_experimental":{"minRingSize":1024,"maxRingSize":1024,"requestHashHeader":%q}}]}`

// DefaultMaxConnectionAge is the --max-connection-age of the servers.
const DefaultMaxConnectionAge = 5 * time.Minute

// ConnectionAge returns the server options that end every client connection
// after about age (gRPC adds ±10% jitter) with a GOAWAY: calls running on it
// finish (no grace limit: a long model stream or event stream is never
// cut), new calls go over a new connection. Zero or negative: none.
func ConnectionAge(age time.Duration) []grpc.ServerOption {
	if age <= 0 {
		return nil
	}
	return []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: age})}
}

// MaxConnectionAgeFlag registers --max-connection-age on fs, defaulting
// from env's DSH_MAX_CONNECTION_AGE (a malformed value is left in env.Err).
func MaxConnectionAgeFlag(fs *flag.FlagSet, env *cmdline.Env) *time.Duration {
	def := env.Duration("DSH_MAX_CONNECTION_AGE", DefaultMaxConnectionAge)
	return fs.Duration("max-connection-age", def, "end each client connection after this long (gracefully: running calls finish) so clients re-resolve and new replicas get traffic; 0 never (env DSH_MAX_CONNECTION_AGE)")
}
