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
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) { benchPacedFlush(b, n, 4, 500*time.Millisecond, nil) })
	}
}

// BenchmarkPacedFlushCursors is BenchmarkPacedFlush with the event
// publisher's cursor saves beside the flushes: every 200 ms (its
// CursorEvery) each session whose log grew since the last save gets its
// published cursor raised to its durable length, one SetPublishedCursor
// after another (the publisher before §19) or in one SetPublishedCursors.
// The WAL is not checkpointed, so frames/op (WAL pages per flush, the
// saves' included) counts what the commits wrote. CPU per flush includes
// the saves.
func BenchmarkPacedFlushCursors(b *testing.B) {
	for _, n := range []int{300, 1000} {
		for _, mode := range cursorSaveModes {
			b.Run(fmt.Sprintf("sessions=%d/%s", n, mode.name), func(b *testing.B) {
				benchPacedFlush(b, n, 4, 500*time.Millisecond, mode.save)
			})
		}
	}
}

func benchPacedFlush(b *testing.B, sessions, batch int, period time.Duration, save func(*testing.B, *Store, []string, []int64)) {
	var commits, requests atomic.Int64
	path := filepath.Join(b.TempDir(), "dsh.db")
	s, err := Open(b.Context(), Config{Path: path, OnCommit: func(c CommitStats) {
		commits.Add(1)
		requests.Add(int64(c.Requests))
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if save != nil {
		s.execWriter(b, "PRAGMA wal_autocheckpoint = 0")
	}
	durable := make([]atomic.Int64, sessions) // each session's stored length, for the saver
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
	frames0 := walFrames(b, path)
	b.ResetTimer()
	cpu := cputime.Process()
	c0, r0 := commits.Load(), requests.Load()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	saved := make(chan struct{})
	go func() {
		defer close(saved)
		if save == nil {
			return
		}
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		last := make([]int64, sessions)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			var ids []string
			var next []int64
			for g := range sessions {
				if n := durable[g].Load(); n > last[g] {
					ids, next = append(ids, fmt.Sprint("paced-", g)), append(next, n)
					last[g] = n
				}
			}
			save(b, s, ids, next)
		}
	}()
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
				durable[g].Store(int64((k + 1) * batch))
			}
		})
	}
	wg.Wait()
	close(stop)
	<-saved
	b.StopTimer()
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	if save != nil {
		b.ReportMetric(float64(walFrames(b, path)-frames0)/float64(b.N), "frames/op")
	}
	b.ReportMetric(float64(requests.Load()-r0)/float64(commits.Load()-c0), "reqs/commit")
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2])/float64(time.Millisecond), "p50-ms")
		b.ReportMetric(float64(all[len(all)*99/100])/float64(time.Millisecond), "p99-ms")
	}
}
