package agent_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsh-dev/dsh/services/agent"
)

// BenchmarkStepContext is BenchmarkStep at step 100 (SQLite NORMAL) with
// the context manager off and on, in the same run: "on" adds the pressure
// check after every step (a cached model context and an O(1) token meter
// reading; the fake gateway knows no window, so no compaction runs). The
// meter's fold itself is in every Log append either way (see
// internal/session BenchmarkMeter).
func BenchmarkStepContext(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "compaction=off"
		if on {
			name = "compaction=on"
		}
		b.Run(name, func(b *testing.B) {
			benchSteps(b, 100, nil, agent.ServerConfig{DataDir: b.TempDir(), Synchronous: "NORMAL", Service: agent.Config{NoCompaction: !on}},
				grpc.WithTransportCredentials(insecure.NewCredentials()))
		})
	}
}
