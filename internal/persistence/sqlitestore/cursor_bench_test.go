package sqlitestore

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// BenchmarkCursorSave measures the event publisher's cursor save (every
// CursorEvery, 200 ms by default): N sessions, each with a stored log, have
// their published cursors raised by one event each, either one
// SetPublishedCursor after another (what the publisher did before §19:
// a commit to wait for per session) or in one SetPublishedCursors. One op
// is one save of all N. The WAL is never checkpointed, so its growth is the
// pages the saves wrote. Reported: CPU and WAL frames (4 KiB pages) per
// save, and commits per save.
func BenchmarkCursorSave(b *testing.B) {
	for _, n := range []int{100, 1000} {
		for _, mode := range cursorSaveModes {
			b.Run(fmt.Sprintf("sessions=%d/%s", n, mode.name), func(b *testing.B) { benchCursorSave(b, n, mode.save) })
		}
	}
}

// cursorSaveModes are the two ways of saving many cursors (they may run
// off the benchmark's goroutine, so they report with b.Error).
var cursorSaveModes = []struct {
	name string
	save func(b *testing.B, s *Store, ids []string, next []int64)
}{
	{"each", func(b *testing.B, s *Store, ids []string, next []int64) {
		for i, id := range ids {
			if err := s.SetPublishedCursor(b.Context(), id, next[i]); err != nil {
				b.Error(err) // b.Fatal only on the benchmark's goroutine
				return
			}
		}
	}},
	{"batch", func(b *testing.B, s *Store, ids []string, next []int64) {
		for _, err := range s.SetPublishedCursors(b.Context(), ids, next) {
			if err != nil {
				b.Error(err)
				return
			}
		}
	}},
}

func benchCursorSave(b *testing.B, sessions int, save func(*testing.B, *Store, []string, []int64)) {
	path := filepath.Join(b.TempDir(), "dsh.db")
	var commits atomic.Int64
	s, err := Open(b.Context(), Config{Path: path, OnCommit: func(CommitStats) { commits.Add(1) }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.execWriter(b, "PRAGMA wal_autocheckpoint = 0")
	ids := make([]string, sessions)
	next := make([]int64, sessions)
	var bld persistencetest.Builder
	for bld.Len() < int64(b.N)+1 {
		bld.CompletedTurn(8)
	}
	for g := range ids {
		ids[g] = fmt.Sprintf("bench-%d", g)
		if err := s.Create(b.Context(), persistencetest.Header(ids[g])); err != nil {
			b.Fatal(err)
		}
		if err := s.Append(b.Context(), ids[g], bld.Events()); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	before, c0 := walFrames(b, path), commits.Load()
	b.ResetTimer()
	cpu := cputime.Process()
	for i := range b.N {
		for g := range next {
			next[g] = int64(i) + 1
		}
		save(b, s, ids, next)
	}
	b.StopTimer()
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(walFrames(b, path)-before)/float64(b.N), "frames/op")
	b.ReportMetric(float64(commits.Load()-c0)/float64(b.N), "commits/op")
}
