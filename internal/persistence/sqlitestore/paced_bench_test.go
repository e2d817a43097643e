package sqlitestore

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// BenchmarkPacedFlush is the load ladder's write pattern, which
// BenchmarkConcurrentFlush (every session flushing again the moment its
// last flush returned) is not: N sessions each flush a 4-event batch every
// period (a step's model latency), started at random offsets, so that
// flushes arrive spread over time at N/period per second and a group holds
// what arrived while the previous one committed. Reported: CPU per flush
// (the whole process: encoding, committer, fsync), requests per commit,
// and the flush latency (Append to its return) p50 and p99.
func BenchmarkPacedFlush(b *testing.B) {
	for _, n := range []int{30, 300} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) { benchPacedFlush(b, n, 4, 500*time.Millisecond) })
	}
}

func benchPacedFlush(b *testing.B, sessions, batch int, period time.Duration) {
	var commits, requests atomic.Int64
	s, err := Open(b.Context(), Config{Path: filepath.Join(b.TempDir(), "dsh.db"), OnCommit: func(c CommitStats) {
		commits.Add(1)
		requests.Add(int64(c.Requests))
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	per := (b.N + sessions - 1) / sessions
	logs := make([][]*sessionv1.SessionEvent, sessions)
	for g := range sessions {
		if err := s.Create(b.Context(), persistencetest.Header(fmt.Sprint("paced-", g))); err != nil {
			b.Fatal(err)
		}
		var bld persistencetest.Builder
		for bld.Len() < int64(per*batch) {
			bld.CompletedTurn(8)
		}
		logs[g] = bld.Events()
	}
	lat := make([][]time.Duration, sessions)
	runtime.GC()
	b.ResetTimer()
	cpu := cputime.Process()
	c0, r0 := commits.Load(), requests.Load()
	var wg sync.WaitGroup
	for g := range sessions {
		n := max(min(per, b.N-g*per), 0)
		wg.Go(func() {
			next := time.Now().Add(rand.N(period))
			for k := range n {
				time.Sleep(time.Until(next))
				next = next.Add(period)
				start := time.Now()
				if err := s.Append(b.Context(), fmt.Sprint("paced-", g), logs[g][k*batch:(k+1)*batch]); err != nil {
					b.Error(err)
					return
				}
				lat[g] = append(lat[g], time.Since(start))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(requests.Load()-r0)/float64(commits.Load()-c0), "reqs/commit")
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2])/float64(time.Millisecond), "p50-ms")
		b.ReportMetric(float64(all[len(all)*99/100])/float64(time.Millisecond), "p99-ms")
	}
}
