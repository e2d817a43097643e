package sqlitestore

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// walFrameSize is one WAL frame: a 24-byte header and a page.
const walFrameSize = 24 + 4096

// prefill is the stored log length of each session before the measurement.
const prefill = 200

// BenchmarkFlushPages measures the write amplification of group commit:
// N sessions, each with a stored log of prefill events already (a session
// some turns in, as under the load ladder), flush 4-event batches at once
// (as BenchmarkConcurrentFlush) with the WAL never checkpointed, so its
// size counts every page frame the commits wrote. Reported: CPU per batch,
// WAL frames (4 KiB pages) per commit and per appended event, and requests
// per commit (the group size).
func BenchmarkFlushPages(b *testing.B) {
	for _, n := range []int{16, 100, 1000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) { benchFlushPages(b, n, 4) })
	}
}

func benchFlushPages(b *testing.B, sessions, batch int) {
	path := filepath.Join(b.TempDir(), "dsh.db")
	var commits, requests atomic.Int64
	s, err := Open(b.Context(), Config{Path: path, OnCommit: func(c CommitStats) {
		commits.Add(1)
		requests.Add(int64(c.Requests))
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.execWriter(b, "PRAGMA wal_autocheckpoint = 0")
	per := (b.N + sessions - 1) / sessions
	logs := make([][]*sessionv1.SessionEvent, sessions)
	for g := range sessions {
		id := fmt.Sprintf("bench-%d", g)
		if err := s.Create(b.Context(), persistencetest.Header(id)); err != nil {
			b.Fatal(err)
		}
		var bld persistencetest.Builder
		for bld.Len() < prefill+int64(per*batch) {
			bld.CompletedTurn(8)
		}
		logs[g] = bld.Events()
	}
	// The prefill in batches too, so that the stored rows are a flushed
	// log's (the old schema stored one row per event whatever the batch).
	var wg sync.WaitGroup
	for g := range sessions {
		wg.Go(func() {
			for k := 0; k < prefill; k += batch {
				if err := s.Append(b.Context(), fmt.Sprintf("bench-%d", g), logs[g][k:k+batch]); err != nil {
					b.Error(err)
					return
				}
			}
			logs[g] = logs[g][prefill:]
		})
	}
	wg.Wait()
	runtime.GC()
	before := walFrames(b, path)
	c0, r0 := commits.Load(), requests.Load()
	b.ResetTimer()
	cpu := cputime.Process()
	persistencetest.AppendSpread(b, s, logs, per, batch)
	b.StopTimer()
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	frames := float64(walFrames(b, path) - before)
	nc := float64(commits.Load() - c0)
	b.ReportMetric(frames/nc, "frames/commit")
	b.ReportMetric(frames/float64(batch*b.N), "frames/event")
	b.ReportMetric(float64(requests.Load()-r0)/nc, "reqs/commit")
}

func walFrames(b *testing.B, path string) int64 {
	fi, err := os.Stat(path + "-wal")
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		b.Fatal(err)
	}
	return max(fi.Size()-32, 0) / walFrameSize
}
