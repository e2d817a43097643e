package events_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
)

// envChildNATS makes the test binary an embedded NATS server for the
// fan-out benchmark (natsChild): its value is the store directory.
const envChildNATS = "DSH_EVENTS_BENCH_NATS"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envChildNATS); dir != "" {
		os.Exit(natsChild(dir))
	}
	os.Exit(m.Run())
}

// natsChild runs an embedded NATS server (internal/natstest) in this
// process: it prints the server's URL, then answers each line read from
// stdin with the process's CPU time in nanoseconds, and shuts the server
// down when stdin closes.
func natsChild(dir string) int {
	srv, err := natstest.New(natstest.Options{StoreDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Shutdown()
	fmt.Println(srv.URL())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println(int64(cputime.Process()))
	}
	return 0
}

// natsProc is the embedded NATS server of natsChild in a child process, so
// a benchmark tells the publisher's CPU (this process) from the server's.
type natsProc struct {
	url string
	in  io.WriteCloser
	out *bufio.Scanner
}

func startNATSProc(b *testing.B) *natsProc {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildNATS+"="+b.TempDir())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		_ = cmd.Wait()
	})
	p := &natsProc{in: in, out: bufio.NewScanner(out)}
	if !p.out.Scan() {
		b.Fatalf("nats child: no URL (%v)", p.out.Err())
	}
	p.url = strings.TrimSpace(p.out.Text())
	return p
}

// cpu is the server process's CPU time so far.
func (p *natsProc) cpu(b *testing.B) time.Duration {
	b.Helper()
	if _, err := io.WriteString(p.in, "cpu\n"); err != nil {
		b.Fatal(err)
	}
	if !p.out.Scan() {
		b.Fatalf("nats child: no answer (%v)", p.out.Err())
	}
	n, err := strconv.ParseInt(strings.TrimSpace(p.out.Text()), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(n)
}

// fanoutEvents is a step's worth of events as the agent stores them: step
// start, text chunks, a tool call's start and end; their seqs are set by the
// caller.
func fanoutEvents(n int) []*sessionv1.SessionEvent {
	evs := make([]*sessionv1.SessionEvent, n)
	for i := range evs {
		ev := &sessionv1.SessionEvent{Time: 1_700_000_000_000 + int64(i)}
		switch i % 4 {
		case 0:
			ev.Payload = &sessionv1.SessionEvent_StepStart{StepStart: &sessionv1.StepStart{Turn: 1, Step: int32(i)}}
		case 3:
			ev.Payload = &sessionv1.SessionEvent_StepEnd{StepEnd: &sessionv1.StepEnd{Turn: 1, Step: int32(i)}}
		default:
			ev.Payload = &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: int32(i),
				Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: strings.Repeat("word ", 12)}}}}}
		}
		evs[i] = ev
	}
	return evs
}

// BenchmarkFanout measures the publisher as the agent drives it under
// load: many sessions, each handing over flushes of 4 stored events with
// their encodings (DurableEncoded), the next round of flushes handed over
// while the publisher is at most two rounds behind; JetStream (an embedded
// server in a child process) acknowledges every event. One op is one event.
// It reports the CPU per event of this process (the publisher, the NATS
// client and the tiny producer: what the agent spends) and of the server
// beside ns/op (wall time: the fan-out's throughput) and the allocations.
func BenchmarkFanout(b *testing.B) {
	for _, sessions := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) { benchFanout(b, sessions) })
	}
}

func benchFanout(b *testing.B, sessions int) {
	const perFlush = 4
	srv := startNATSProc(b)
	p, err := events.New(b.Context(), events.Config{Conn: events.Conn{URL: srv.url}, Store: newMemStore(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("sess-%04d-%s", i, strings.Repeat("x", 20))
	}
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	rounds := max(1, b.N/(sessions*perFlush))
	// The events are made before the clock starts: what is measured is
	// the handing over and the publishing, from each session's creation
	// (its first publication reads the stream's tail, as for every new
	// session of the agent).
	type flush struct {
		evs []*sessionv1.SessionEvent
		pb  [][]byte
	}
	step := fanoutEvents(perFlush)
	work := make([][]flush, rounds)
	for r := range work {
		work[r] = make([]flush, sessions)
		for i := range work[r] {
			f := flush{evs: make([]*sessionv1.SessionEvent, perFlush), pb: make([][]byte, perFlush)}
			for k := range f.evs {
				f.evs[k] = proto.CloneOf(step[k])
				f.evs[k].Seq = int64(r*perFlush + k)
				f.pb[k] = marshal(b, f.evs[k])
			}
			work[r][i] = f
		}
	}
	b.ReportAllocs()
	srvBefore, before := srv.cpu(b), cputime.Process()
	b.ResetTimer()
	start := time.Now()
	for _, id := range ids {
		p.Created("", id)
	}
	for r := range work {
		for p.Pending() > 2*sessions*perFlush {
			time.Sleep(200 * time.Microsecond) // back-pressure: the producer waits for the publisher
		}
		for i, f := range work[r] {
			p.DurableEncoded("", ids[i], f.evs, f.pb)
		}
	}
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	wall := time.Since(start)
	cpu, srvCPU := cputime.Process()-before, srv.cpu(b)-srvBefore
	n := float64(rounds * sessions * perFlush)
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/n, "cpu-µs/event")
	b.ReportMetric(float64(srvCPU.Nanoseconds())/1e3/n, "server-cpu-µs/event")
	b.ReportMetric(n/wall.Seconds(), "events/s")
}

func marshal(b *testing.B, ev *sessionv1.SessionEvent) []byte {
	pb, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
	if err != nil {
		b.Fatal(err)
	}
	return pb
}
