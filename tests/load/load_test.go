// Package load is dsh's load benchmark: S sessions at once through the real
// services — the agent (SQLite store, default settings), the LLM gateway
// and the built-in toolhost, each its own process built once by TestMain —
// against an OpenAI-compatible fake upstream that answers after a
// configurable delay, with real NATS JetStream (a nats-server process of
// its own, which TestMain builds with the services).
//
// Each session runs its turns of -load.steps tool calls of -load.tool
// (`read` or `bash`) and a final answer. The benchmark reports, per ladder
// level: the steps taken, the errors by gRPC code or turn-end kind, the
// harness-added step time (from the upstream's own clock: the end of one
// response to the arrival of the next request of the same turn) at p50 and
// p99, the CPU of each process (its own, and for the toolhost also that of
// the tool processes it reaped) per step, and each process's peak RSS.
//
// `make load` runs the ladder (see the Makefile for the knobs);
// TestLoadSmoke runs three sessions so the harness itself stays tested.
package load

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	_ "modernc.org/sqlite" // reads the agent's store for the fan-out figures

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/proctest"
)

var (
	flagSessions = flag.String("load.sessions", "10,100,1000", "ladder: concurrent sessions per level, comma-separated")
	flagTool     = flag.String("load.tool", "read", "tool of every step: read or bash")
	flagDelay    = flag.Duration("load.delay", time.Second, "the model's latency: the upstream answers each request after this long")
	flagJitter   = flag.Duration("load.jitter", 0, "spread each model latency uniformly over -load.delay ± this (0: every answer after exactly -load.delay, so sessions that moved together stay together; real providers' latencies vary)")
	flagRamp     = flag.Duration("load.ramp", 0, "spread the sessions' first turns evenly over this long (0: all at once, a thundering herd; one -load.delay: sessions arriving steadily)")
	flagSteps    = flag.Int("load.steps", 5, "tool steps per turn")
	flagTurns    = flag.Int("load.turns", 1, "turns per session")
	flagWarmup   = flag.Int("load.warmup", 0, "turns per session run before the measured window (not measured): the processes' memory is then mapped in, as on a node that has been serving (a cold start pays a minor page fault per new 4 KiB page)")
	flagAgent    = flag.String("load.agent-args", "", "extra agent flags, space-separated (e.g. --sqlite-sync=NORMAL)")
	flagGateway  = flag.String("load.gateway-args", "", "extra gateway flags, space-separated (e.g. --prefix-cache-mib=0)")
	flagEnv      = flag.String("load.env", "", "extra environment of a service, space-separated process=KEY=VALUE (process: agent, llmgateway or toolhost; e.g. agent=GOGC=200)")
	flagPprof    = flag.String("load.pprof", "", "directory: take a CPU and an allocation profile of each process (through --debug-addr) during each level's first -load.pprof-seconds")
	flagPprofSec = flag.Int("load.pprof-seconds", 5, "length of the -load.pprof profiles")
)

// binDir holds the binaries TestMain built.
var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "dsh-load-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := func(pkgs ...string) error {
		cmd := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, pkgs...)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		return cmd.Run()
	}
	err = build("github.com/dsh-dev/dsh/services/llmgateway/cmd/llmgateway",
		"github.com/dsh-dev/dsh/services/toolhost/cmd/toolhost",
		"github.com/dsh-dev/dsh/services/agent/cmd/agent",
		// The event fan-out's server, the same nats-server the embedded one
		// is, as a process of its own: its CPU is measured apart from the
		// driver's.
		"github.com/nats-io/nats-server/v2")
	if err == nil {
		// As make build: with cgo, the launcher's C first stage.
		err = proctest.BuildLauncher(filepath.Join(dir, "dsh-sandbox-launcher"), true)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load: go build:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// level is one rung of the ladder.
type level struct {
	sessions, steps, turns int
	warmup                 int // unmeasured turns per session before the window
	tool                   string
	delay, jitter, ramp    time.Duration
	agentArgs, gatewayArgs []string
}

// result is what one level measured.
type result struct {
	level
	stepsTaken int            // tool steps (gaps the upstream measured)
	requests   int            // model requests answered
	conns      int64          // connections the gateway opened to the upstream
	errors     map[string]int // by gRPC code or turn-end kind
	p50, p99   time.Duration  // harness-added step time
	wall       time.Duration  // first Send to last turn end
	cpu        map[string]cpu // per process, over the measured window
	driver     time.Duration  // this process's CPU (driver, fake upstream) over the window
	busy       float64        // the machine's busy share of all its cores over the window
	steal      float64        // the part of it the hypervisor gave to other guests
	rss        map[string]int64
	// The event fan-out at the window's end: events stored, events in
	// the stream then, and the agent's CPU from the window's start until
	// the stream held every stored event (drain: the wait after the window).
	stored, publishedAtEnd int64
	agentDrained, drain    time.Duration
	drained                bool // the stream came to hold every stored event
}

// fanoutRow describes the event fan-out's backlog at the window's end and
// the agent's CPU per step including publishing it: the window alone does
// not count the work of a publisher that fell behind.
func (r result) fanoutRow() string {
	if r.stepsTaken == 0 || r.stored == 0 {
		return ""
	}
	head := fmt.Sprintf("fan-out: %d of %d stored events in the stream at the window's end", r.publishedAtEnd, r.stored)
	perStep, ok := r.drainedPerStep()
	if !ok {
		return head + "; not drained (not measured)"
	}
	return fmt.Sprintf("%s; drained %.1f s later; agent CPU ms/step including the drain %.2f", head, r.drain.Seconds(), perStep)
}

// faultsRow gives each service's minor page faults per step in the window.
func (r result) faultsRow() string {
	if r.stepsTaken == 0 {
		return ""
	}
	per := func(name string) float64 { return float64(r.cpu[name].faults) / float64(r.stepsTaken) }
	return fmt.Sprintf("minor page faults per step: agent %.2f / gateway %.2f / toolhost %.2f", per("agent"), per("llmgateway"), per("toolhost"))
}

// drainedPerStep is the agent's CPU per step including the drain, when the
// drain was measured.
func (r result) drainedPerStep() (float64, bool) {
	if r.stepsTaken == 0 || !r.drained {
		return 0, false
	}
	return float64(r.agentDrained.Microseconds()) / 1000 / float64(r.stepsTaken), true
}

// harnessCPUPerStep is agent + gateway + toolhost CPU (not the tool
// processes) per step.
func (r result) harnessCPUPerStep() time.Duration {
	if r.stepsTaken == 0 {
		return 0
	}
	var sum time.Duration
	for _, name := range procNames {
		sum += r.cpu[name].self
	}
	return sum / time.Duration(r.stepsTaken)
}

func (r result) errorText() string {
	if len(r.errors) == 0 {
		return "0"
	}
	var keys []string
	for k := range r.errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.errors[k]))
	}
	return strings.Join(parts, ", ")
}

var procNames = []string{"agent", "llmgateway", "toolhost"}

// row is the result as a docs/benchmarks.md table row.
func (r result) row() string {
	perStep := func(d time.Duration) string {
		if r.stepsTaken == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000/float64(r.stepsTaken))
	}
	return fmt.Sprintf("| %s | %d | %v | %d | %s | %.1f | %.1f | %s / %s / %s (+%s tools) | %.2f | %s | %s | %.0f %% (%.0f %%) | %d / %d / %d |",
		r.tool, r.sessions, r.ramp, r.stepsTaken, r.errorText(),
		float64(r.p50.Microseconds())/1000, float64(r.p99.Microseconds())/1000,
		perStep(r.cpu["agent"].self), perStep(r.cpu["llmgateway"].self), perStep(r.cpu["toolhost"].self), perStep(r.cpu["toolhost"].children),
		float64(r.harnessCPUPerStep().Microseconds())/1000, perStep(r.cpu["nats"].self), perStep(r.driver), 100*r.busy, 100*r.steal,
		r.rss["agent"]/1024, r.rss["llmgateway"]/1024, r.rss["toolhost"]/1024)
}

const tableHead = "| tool | sessions | ramp | steps | errors | step p50 ms | step p99 ms | CPU ms/step agent / gateway / toolhost (+tools) | harness CPU ms/step | NATS CPU ms/step | driver + upstream CPU ms/step | machine busy (steal) | peak RSS MiB agent / gateway / toolhost |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// BenchmarkLoad runs the ladder of -load.sessions once each (use
// -benchtime 1x) and prints the table.
// It skips unless DSH_LOAD=1 (`make load` sets it), so `make bench` does not
// run a ladder of minutes.
func BenchmarkLoad(b *testing.B) {
	if os.Getenv("DSH_LOAD") != "1" {
		b.Skip("the load ladder runs under `make load` (DSH_LOAD=1)")
	}
	var rows, fanout []string
	for _, f := range strings.Split(*flagSessions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("-load.sessions: %q is not a positive count", f)
		}
		lv := level{sessions: n, steps: *flagSteps, turns: *flagTurns, warmup: *flagWarmup, tool: *flagTool, delay: *flagDelay, jitter: *flagJitter, ramp: *flagRamp, agentArgs: strings.Fields(*flagAgent), gatewayArgs: strings.Fields(*flagGateway)}
		b.Run(fmt.Sprintf("tool=%s/sessions=%d", lv.tool, n), func(b *testing.B) {
			var r result
			for b.Loop() {
				r = runLevel(b, lv)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(r.stepsTaken), "steps")
			b.ReportMetric(float64(len(r.errors)), "error-kinds")
			b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(r.harnessCPUPerStep().Microseconds())/1000, "harness-cpu-ms/step")
			b.ReportMetric(float64(r.conns), "upstream-conns")
			if perStep, ok := r.drainedPerStep(); ok {
				b.ReportMetric(perStep, "agent-cpu-ms/step-drained")
			}
			rows = append(rows, r.row())
			for _, f := range []string{r.fanoutRow(), r.faultsRow()} {
				if f != "" {
					fanout = append(fanout, fmt.Sprintf("%d sessions: %s", n, f))
				}
			}
		})
	}
	fmt.Printf("\n%s\n%s\n", tableHead, strings.Join(rows, "\n"))
	if len(fanout) > 0 {
		fmt.Printf("\n%s\n", strings.Join(fanout, "\n"))
	}
}

// TestLoadSmoke runs three sessions of two steps through the real stack and
// checks the measurement itself: every step measured, no error.
func TestLoadSmoke(t *testing.T) {
	for _, tc := range []struct {
		tool   string
		warmup int
	}{{"read", 0}, {"bash", 0}, {"read", 1}} {
		name := tc.tool
		if tc.warmup > 0 {
			name += "/warm" // the warm-up's steps are not counted
		}
		t.Run(name, func(t *testing.T) {
			r := runLevel(t, level{sessions: 3, steps: 2, turns: 1, warmup: tc.warmup, tool: tc.tool})
			if len(r.errors) != 0 {
				t.Fatalf("errors: %s", r.errorText())
			}
			if r.stepsTaken != 3*2 || r.requests != 3*3 {
				t.Fatalf("upstream measured %d steps over %d requests, want 6 over 9", r.stepsTaken, r.requests)
			}
			// The gateway keeps its provider connections: three sessions
			// in lockstep need about three, not one per request.
			if r.conns > 2*3 {
				t.Errorf("the gateway opened %d connections for %d requests of 3 sessions", r.conns, r.requests)
			}
			if r.p99 <= 0 || r.cpu["agent"].self < 0 || r.rss["agent"] <= 0 || r.busy <= 0 || r.busy > 1 || r.driver < 0 || r.cpu["agent"].faults <= 0 {
				t.Fatalf("implausible measurement: p99 %v, agent CPU %v, RSS %d KiB, machine busy %.3f, driver CPU %v", r.p99, r.cpu["agent"], r.rss["agent"], r.busy, r.driver)
			}
			// The fan-out's server is a process of its own, measured apart
			// (its CPU over six steps may be under one 10 ms tick), and the
			// events stored reached it.
			if c, ok := r.cpu["nats"]; !ok || c.self < 0 || r.stored == 0 || !r.drained {
				t.Fatalf("NATS measured %v (%v), %d events stored, all in its stream: %v", ok, c, r.stored, r.drained)
			}
			t.Log(r.row())
			t.Log(r.fanoutRow())
			t.Log(r.faultsRow())
		})
	}
}

// proc is a started service binary.
type proc struct {
	cmd  *exec.Cmd
	out  *proctest.Buffer
	done chan struct{}
}

func startProc(tb testing.TB, name string, env []string, args ...string) *proc {
	tb.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = env
	p := &proc{cmd: cmd, out: &proctest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if tb.Failed() {
			tb.Logf("--- %s ---\n%s", name, p.out.String())
		}
	})
	return p
}

// startNATS starts nats-server with JetStream, its store in a temporary
// directory, on a free loopback port, and waits until it takes a client.
func startNATS(ctx context.Context, tb testing.TB) (*proc, string) {
	tb.Helper()
	addr := proctest.FreeAddr(tb)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	p := startProc(tb, "nats-server", cleanEnv(), "-js", "-sd", tb.TempDir(), "-a", host, "-p", port)
	url := "nats://" + addr
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
			return p, url
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("nats-server on %s: %v\n%s", addr, err, p.out.String())
		case <-p.done:
			tb.Fatalf("nats-server exited:\n%s", p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// procEnv parses -load.env: space-separated process=KEY=VALUE, by process.
func procEnv(spec string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, f := range strings.Fields(spec) {
		name, kv, ok := strings.Cut(f, "=")
		if !ok || !strings.Contains(kv, "=") || !slices.Contains(procNames, name) {
			return nil, fmt.Errorf("-load.env: %q is not process=KEY=VALUE with process agent, llmgateway or toolhost", f)
		}
		out[name] = append(out[name], kv)
	}
	return out, nil
}

// cleanEnv is the environment without provider keys and dsh settings.
func cleanEnv(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasSuffix(k, "_API_KEY") || strings.HasPrefix(k, "OPENAI_") || strings.HasPrefix(k, "DSH_") ||
			strings.HasPrefix(k, "OTEL_") || strings.HasPrefix(k, "NATS_") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func dial(ctx context.Context, tb testing.TB, addr string) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpcserver.Dial(addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	proctest.WaitServing(ctx, tb, conn, "")
	return conn
}

// runLevel starts a fresh stack, runs lv and measures it.
func runLevel(tb testing.TB, lv level) result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	up := newUpstream(lv.delay, lv.jitter, lv.steps, lv.tool)
	url, stopUp, err := up.serve()
	if err != nil {
		tb.Fatal(err)
	}
	defer stopUp()
	natsProc, natsURL := startNATS(ctx, tb)
	ws, data := tb.TempDir(), tb.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte(strings.Repeat("a line of notes for the load benchmark\n", 40)), 0o644); err != nil {
		tb.Fatal(err)
	}
	gwAddr, thAddr, agAddr := proctest.FreeAddr(tb), proctest.FreeAddr(tb), proctest.FreeAddr(tb)
	env, err := procEnv(*flagEnv)
	if err != nil {
		tb.Fatal(err)
	}
	debug := map[string][]string{}
	if *flagPprof != "" {
		for _, name := range procNames {
			debug[name] = []string{"--debug-addr", proctest.FreeAddr(tb)}
		}
	}
	procs := map[string]*proc{
		"nats":       natsProc,
		"llmgateway": startProc(tb, "llmgateway", cleanEnv(append([]string{"OPENAI_API_KEY=load", "OPENAI_BASE_URL=" + url, "OPENAI_MODEL=load"}, env["llmgateway"]...)...), append(append([]string{"--listen", gwAddr}, debug["llmgateway"]...), lv.gatewayArgs...)...),
		"toolhost":   startProc(tb, "toolhost", cleanEnv(env["toolhost"]...), append([]string{"--listen", thAddr, "--workspace", ws}, debug["toolhost"]...)...),
	}
	dial(ctx, tb, gwAddr)
	dial(ctx, tb, thAddr)
	procs["agent"] = startProc(tb, "agent", cleanEnv(env["agent"]...), append(append([]string{"--listen", agAddr, "--gateway", gwAddr,
		"--toolhost", "builtin=" + thAddr, "--data", data, "--nats", natsURL,
		"--approval-rule", "*=allow", "--no-titles"}, debug["agent"]...), lv.agentArgs...)...)
	// A few client connections, as several frontends would hold.
	var clients []agentv1.AgentServiceClient
	for range 4 {
		clients = append(clients, agentv1.NewAgentServiceClient(dial(ctx, tb, agAddr)))
	}

	// Create the sessions before the measured window.
	ids := make([]string, lv.sessions)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var createErr error
	var mu sync.Mutex
	for i := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			resp, err := clients[i%len(clients)].CreateSession(ctx, &agentv1.CreateSessionRequest{
				Cwd:     ws,
				Options: &sessionv1.SessionOptions{Provider: "openai", Model: "load", WorkspaceRoot: ws},
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				createErr = err
				return
			}
			ids[i] = resp.GetSession().GetHeader().GetId()
		}()
	}
	wg.Wait()
	if createErr != nil {
		tb.Fatalf("CreateSession: %v", createErr)
	}

	if lv.warmup > 0 {
		warmErrs := map[string]int{}
		drive(ctx, lv, ids, clients, func(i, turn int) string { return prompt(i, -1-turn) }, lv.warmup, func(kind string) {
			mu.Lock()
			warmErrs[kind]++
			mu.Unlock()
		})
		if len(warmErrs) > 0 {
			tb.Fatalf("warm-up turns failed: %v", warmErrs)
		}
		up.reset()
	}

	before := map[string]cpu{}
	for name, p := range procs {
		c, err := readCPU(p.cmd.Process.Pid)
		if err != nil {
			tb.Fatal(err)
		}
		before[name] = c
	}
	driverBefore, err := readCPU(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	machineBefore, err := readMachineCPU()
	if err != nil {
		tb.Fatal(err)
	}
	r := result{level: lv, errors: map[string]int{}, cpu: map[string]cpu{}, rss: map[string]int64{}}
	count := func(kind string) {
		mu.Lock()
		r.errors[kind]++
		mu.Unlock()
	}
	started := time.Now()
	for name, d := range debug {
		wg.Add(1)
		go func() {
			defer wg.Done()
			profile(tb, d[1], "profile", filepath.Join(*flagPprof, fmt.Sprintf("%s-%s-%d.pprof", name, lv.tool, lv.sessions)))
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			profile(tb, d[1], "allocs", filepath.Join(*flagPprof, fmt.Sprintf("%s-%s-%d.allocs.pprof", name, lv.tool, lv.sessions)))
		}()
	}
	drive(ctx, lv, ids, clients, prompt, lv.turns, count)
	wg.Wait() // the profiles
	r.wall = time.Since(started)
	driverAfter, err := readCPU(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	r.driver = driverAfter.sub(driverBefore).self
	machineAfter, err := readMachineCPU()
	if err != nil {
		tb.Fatal(err)
	}
	r.busy = machineAfter.sub(machineBefore).share()
	r.steal = machineAfter.sub(machineBefore).stealShare()
	for name, p := range procs {
		c, err := readCPU(p.cmd.Process.Pid)
		if err != nil {
			tb.Fatal(err)
		}
		r.cpu[name] = c.sub(before[name])
		if r.rss[name], err = peakRSS(p.cmd.Process.Pid); err != nil {
			tb.Fatal(err)
		}
	}
	measureDrain(tb, &r, natsURL, filepath.Join(data, "sessions.db"), procs["agent"].cmd.Process.Pid, before["agent"])
	gaps := up.gaps()
	r.stepsTaken, r.requests, r.conns = len(gaps), up.requests(), up.conns.Load()
	r.p50, r.p99 = percentile(gaps, 0.50), percentile(gaps, 0.99)
	if up.bad > 0 {
		r.errors["upstream: unparsable request"] += up.bad
	}
	return r
}

// profile saves a profile of the process whose --debug-addr is addr over
// the next -load.pprof-seconds: kind "profile" (CPU) or "allocs" (the
// allocations made in that window).
func profile(tb testing.TB, addr, kind, path string) {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, kind, *flagPprofSec))
	if err != nil {
		tb.Errorf("profile %s: %v", addr, err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		tb.Errorf("profile %s: %v", addr, err)
	}
}

// drive runs turns turns of every session at once (spread over lv.ramp),
// session i's turn t with the user message text(i, t), and returns when
// all have ended; a turn that ends badly is counted and ends its session's
// run.
func drive(ctx context.Context, lv level, ids []string, clients []agentv1.AgentServiceClient, text func(i, turn int) string, turns int, count func(kind string)) {
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%len(clients)]
			if lv.ramp > 0 {
				select {
				case <-time.After(lv.ramp * time.Duration(i) / time.Duration(len(ids))):
				case <-ctx.Done():
					return
				}
			}
			for turn := range turns {
				if kind := runTurn(ctx, c, id, text(i, turn)); kind != "" {
					count(kind)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// runTurn sends text to session id, waits for the session to go idle and
// returns "" when the turn completed, else the kind of failure.
func runTurn(ctx context.Context, c agentv1.AgentServiceClient, id, text string) string {
	s, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		return "GetSession " + status.Code(err).String()
	}
	from := s.GetSession().GetNextSeq()
	_, err = c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: text}}}}})
	if err != nil {
		return "Send " + status.Code(err).String()
	}
	if _, err := c.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
		return "WaitIdle " + status.Code(err).String()
	}
	stream, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: from, NoFollow: true})
	if err != nil {
		return "StreamEvents " + status.Code(err).String()
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return "canceled"
			}
			return "no turn/end"
		}
		if end := resp.GetEvent().GetTurnEnd(); end != nil {
			if end.GetReason().GetCompleted() != nil {
				return ""
			}
			return "turn/end " + fmt.Sprint(end.GetReason().ProtoReflect().WhichOneof(end.GetReason().ProtoReflect().Descriptor().Oneofs().Get(0)).Name())
		}
	}
}

// measureDrain waits (up to two minutes) until the event stream holds every
// event the agent stored and sets r's fan-out figures: the events stored
// and published at the window's end, the wait, and the agent's CPU from
// before (the window's start) until then.
func measureDrain(tb testing.TB, r *result, natsURL, dbPath string, pid int, before cpu) {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(`SELECT coalesce(sum(n), 0) FROM batches`).Scan(&r.stored); err != nil {
		tb.Logf("fan-out: stored events: %v (not measured)", err)
		return
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	for first := true; ; first = false {
		st, err := js.Stream(ctx, events.StreamName)
		if err != nil {
			tb.Logf("fan-out: stream: %v (not measured)", err)
			return
		}
		msgs := int64(st.CachedInfo().State.Msgs)
		if first {
			r.publishedAtEnd = msgs
		}
		if msgs >= r.stored {
			break
		}
		select {
		case <-ctx.Done():
			tb.Logf("fan-out: %d of %d events in the stream after %v", msgs, r.stored, time.Since(start))
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	r.drain = time.Since(start)
	c, err := readCPU(pid)
	if err != nil {
		tb.Fatal(err)
	}
	r.agentDrained, r.drained = c.sub(before).self, true
}

func TestProcEnv(t *testing.T) {
	tests := []struct {
		spec    string
		want    map[string][]string
		wantErr bool
	}{
		{"", map[string][]string{}, false},
		{"agent=GOGC=200 agent=GOMAXPROCS=1 toolhost=GOGC=off", map[string][]string{"agent": {"GOGC=200", "GOMAXPROCS=1"}, "toolhost": {"GOGC=off"}}, false},
		{"nats=GOGC=200", nil, true},
		{"agent=GOGC", nil, true},
		{"GOGC=200", nil, true},
	}
	for _, tc := range tests {
		got, err := procEnv(tc.spec)
		if (err != nil) != tc.wantErr {
			t.Errorf("procEnv(%q) error %v, want error %v", tc.spec, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("procEnv(%q) = %v, want %v", tc.spec, got, tc.want)
		}
	}
}
