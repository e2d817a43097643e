package persistencetest

import (
	"fmt"
	"github.com/dsh-dev/dsh/internal/cputime"
	"runtime"
	"sync"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// BenchOpener opens a store over dir for a benchmark.
type BenchOpener func(b *testing.B, dir string) persistence.Store

// Bench runs the persistence benchmarks:
//
//   - Append/batch=N: durable appends of N-event batches (events/s);
//   - FlushAtTurn/T: the cost of flushing one turn (about 20 events) into a
//     session that already holds T turns (flat is the goal);
//   - Load10k: load of a balanced 10,000-event session;
//   - Load10kRepair: load of a 10,000-event session whose last turn is open,
//     including the durable write of its closers.
func Bench(b *testing.B, open BenchOpener) {
	BenchAppend(b, open, 1, 10, 100)
	for _, turns := range []int{10, 1000} {
		b.Run(fmt.Sprintf("FlushAtTurn/%d", turns), func(b *testing.B) { benchFlushAtTurn(b, open, turns) })
	}
	b.Run("Load10k", func(b *testing.B) { benchLoad(b, open, false) })
	b.Run("Load10kRepair", func(b *testing.B) { benchLoad(b, open, true) })
}

// reportCPU reports the CPU milliseconds per op spent since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cputime.Process()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}

func create(b *testing.B, s persistence.Store, id string) {
	b.Helper()
	if err := s.Create(b.Context(), Header(id)); err != nil {
		b.Fatal(err)
	}
}

// grow extends bld to at least n events with completed turns.
func grow(bld *Builder, n int64) {
	for bld.Len() < n {
		bld.CompletedTurn(8)
	}
}

// BenchAppend runs only the Append/batch=N benchmarks.
func BenchAppend(b *testing.B, open BenchOpener, batches ...int) {
	for _, n := range batches {
		b.Run(fmt.Sprintf("Append/batch=%d", n), func(b *testing.B) { benchAppend(b, open, n) })
	}
}

func benchAppend(b *testing.B, open BenchOpener, batch int) {
	s := open(b, b.TempDir())
	defer s.Close()
	create(b, s, "bench")
	var bld Builder
	grow(&bld, int64(batch*b.N))
	evs := bld.Events()
	runtime.GC() // collect the setup's garbage outside the measurement
	b.ResetTimer()
	cpu := cputime.Process()
	for i := range b.N {
		if err := s.Append(b.Context(), "bench", evs[i*batch:(i+1)*batch]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportCPU(b, cpu)
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "events/s")
}

func benchFlushAtTurn(b *testing.B, open BenchOpener, turns int) {
	s := open(b, b.TempDir())
	defer s.Close()
	create(b, s, "bench")
	var bld Builder
	for range turns {
		bld.CompletedTurn(8)
	}
	prefix := bld.Len()
	for i := int64(0); i < prefix; i += 1000 {
		if err := s.Append(b.Context(), "bench", bld.Events()[i:min(i+1000, prefix)]); err != nil {
			b.Fatal(err)
		}
	}
	perTurn := int(prefix) / turns
	for range b.N {
		bld.CompletedTurn(8)
	}
	evs := bld.Events()[prefix:]
	runtime.GC() // collect the setup's garbage outside the measurement
	b.ResetTimer()
	cpu := cputime.Process()
	for i := range b.N {
		if err := s.Append(b.Context(), "bench", evs[i*perTurn:(i+1)*perTurn]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportCPU(b, cpu)
	b.ReportMetric(float64(perTurn), "events/flush")
}

func benchLoad(b *testing.B, open BenchOpener, repair bool) {
	s := open(b, b.TempDir())
	defer s.Close()
	create(b, s, "bench")
	var bld Builder
	grow(&bld, 10_000)
	if err := s.Append(b.Context(), "bench", bld.Events()); err != nil {
		b.Fatal(err)
	}
	var loaded []*sessionv1.SessionEvent
	runtime.GC() // collect the setup's garbage outside the measurement
	b.ResetTimer()
	var cpu time.Duration // CPU time of the loads only
	for range b.N {
		if repair {
			b.StopTimer()
			next := int64(len(loaded))
			if next == 0 {
				next = bld.Len()
			}
			// An open turn whose seqs continue the stored log.
			tail := Builder{events: make([]*sessionv1.SessionEvent, next), turn: bld.turn}
			tail.StartTurn("again")
			tail.StartStep()
			tail.Chunks(3, "x")
			if err := s.Append(b.Context(), "bench", tail.Events()[next:]); err != nil {
				b.Fatal(err)
			}
			bld.turn = tail.turn
			b.StartTimer()
		}
		c := cputime.Process()
		_, evs, err := s.Load(b.Context(), "bench")
		if err != nil {
			b.Fatal(err)
		}
		cpu += cputime.Process() - c
		loaded = evs
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(len(loaded)), "events")
}

// AppendSpread appends b.N batches of batch events from logs, per batches
// for each session "bench-<g>" (the last may take fewer), one goroutine per
// session, and returns when all are stored.
func AppendSpread(b *testing.B, s persistence.Store, logs [][]*sessionv1.SessionEvent, per, batch int) {
	var wg sync.WaitGroup
	for g := range logs {
		n := min(per, b.N-g*per)
		wg.Go(func() {
			for k := range max(n, 0) {
				if err := s.Append(b.Context(), fmt.Sprintf("bench-%d", g), logs[g][k*batch:(k+1)*batch]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchParallel measures durable appends from many sessions at once: b.N
// batches of batch events spread over sessions goroutines, each appending
// to its own session (events/s over all of them). A backend that shares a
// commit (and its fsync) between concurrent writers scales here; one that
// serialises its writers does not.
func BenchParallel(b *testing.B, open BenchOpener, sessions, batch int) {
	s := open(b, b.TempDir())
	defer s.Close()
	per := (b.N + sessions - 1) / sessions
	logs := make([][]*sessionv1.SessionEvent, sessions)
	for g := range sessions {
		create(b, s, fmt.Sprintf("bench-%d", g))
		var bld Builder
		grow(&bld, int64(per*batch))
		logs[g] = bld.Events()
	}
	runtime.GC() // collect the setup's garbage outside the measurement
	b.ResetTimer()
	cpu := cputime.Process()
	AppendSpread(b, s, logs, per, batch)
	b.StopTimer()
	reportCPU(b, cpu)
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "events/s")
}
