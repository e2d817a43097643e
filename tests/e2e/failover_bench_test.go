package e2e

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/pgtest"
)

// BenchmarkFailover is the time from the owner's death (SIGKILL) to the
// session's next event on another replica: the client keeps sending its
// prompt to the surviving replica (every 20 ms while the call fails: the
// forward to the dead owner is refused until the lease expires), and the
// clock stops at the first event of the new turn streamed from it. Two
// replicas as real processes on one PostgreSQL database; the killed one
// restarts between iterations and the roles alternate. ttl=3s is a 1 s
// renewal (TTL/3); ttl=1s the chaos test's setting. Reports the median and
// the p99 (ms) over the iterations.
func BenchmarkFailover(b *testing.B) {
	for _, ttl := range []string{"1s", "3s"} {
		b.Run("ttl="+ttl, func(b *testing.B) { benchFailover(b, ttl) })
	}
}

func benchFailover(b *testing.B, ttl string) {
	ctx := context.Background()
	s := &stack{nats: natstest.Start(b), agentEnv: []string{"DSH_STORE=postgres", "DSH_POSTGRES_DSN=" + pgtest.Database(b), "DSH_LEASE_TTL=" + ttl, "DSH_SWEEP_INTERVAL=0"}}
	a := startStackWith(b, s)
	reps := []*stack{a, a.replica()}
	id := reps[0].createSession(ctx)
	reps[0].runTurn(ctx, id, 0, "first") // stored, owned by reps[0]
	owner := 0
	var took []time.Duration
	for i := 0; b.Loop(); i++ {
		dead, next := reps[owner], reps[1-owner]
		seq, err := next.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
		if err != nil {
			b.Fatal(err)
		}
		from := seq.GetSession().GetNextSeq()
		start := time.Now()
		if err := dead.agent.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		<-dead.agent.done
		for {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := next.client.Send(sctx, &agentv1.SendRequest{SessionId: id, Content: textBlocks(fmt.Sprintf("after kill %d", i))})
			cancel()
			if err == nil {
				break
			}
			if time.Since(start) > time.Minute {
				b.Fatalf("no failover after a minute: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		stream, err := next.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: from})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		b.StopTimer()
		if _, err := next.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
			b.Fatal(err)
		}
		dead.startAgent()
		owner = 1 - owner
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms-median")
	b.ReportMetric(float64(took[(len(took)*99)/100].Microseconds())/1000, "ms-p99")
}
