// Package bench measures the whole stack from the outside: `dsh dev -p`
// (agent, gateway, toolhost and embedded NATS in one process, SQLite
// persistence) on a 10-step task against a local OpenAI-compatible upstream
// that answers instantly, each step one `bash` call of `echo`.
//
// The upstream records, from its side, the gap between finishing one
// response and receiving the next request (the harness's own per-step
// overhead, bash included), the time from launching the binary to the
// first model request, and the process's peak RSS.
package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/proctest"
)

// dshBin is dsh alone; dshWithLauncher has dsh-sandbox-launcher beside it.
var dshBin, dshWithLauncher string

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // no benchmark asked for: skip the build
	}
	dir, err := os.MkdirTemp("", "dsh-bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// bin/ is the layout `make build` and the Dockerfile produce: dsh with
	// the small static sandbox launcher beside it; single/ is dsh alone
	// (the toolhost then re-executes dsh itself as the launcher).
	dshBin = filepath.Join(dir, "single", "dsh")
	dshWithLauncher = filepath.Join(dir, "bin", "dsh")
	builds := [][]string{
		{"build", "-o", dshBin, "github.com/dsh-dev/dsh/cmd/dsh"},
		{"build", "-o", dshWithLauncher, "github.com/dsh-dev/dsh/cmd/dsh"},
	}
	for _, args := range builds {
		cmd := exec.Command("go", args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: go build:", err)
			os.Exit(1)
		}
	}
	// Static with its C first stage, as make build.
	if err := proctest.BuildLauncher(filepath.Join(dir, "bin", "dsh-sandbox-launcher"), true); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const steps = 10

// upstream is an instant OpenAI-compatible chat-completions server.
type upstream struct {
	mu       sync.Mutex
	requests []time.Time // arrival of each request
	finished []time.Time // end of each response
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
		Tools []json.RawMessage `json:"tools"`
	}
	_ = json.Unmarshal(body, &req)
	if len(req.Tools) == 0 {
		// The session-title call (no tools): answer, but it is not a step.
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"t\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Echo steps\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		return
	}
	tools := 0
	for _, m := range req.Messages {
		if m.Role == "tool" {
			tools++
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(s string) { fmt.Fprintf(w, "data: %s\n\n", s) }
	head := `{"id":"c","object":"chat.completion.chunk","created":1,"model":"bench","choices":[`
	if tools < steps {
		args, _ := json.Marshal(map[string]string{"command": fmt.Sprintf("echo step %d", tools+1)})
		argStr, _ := json.Marshal(string(args))
		chunk(head + fmt.Sprintf(`{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_%d","type":"function","function":{"name":"bash","arguments":%s}}]},"finish_reason":null}]}`, tools+1, argStr))
		chunk(head + `{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
	} else {
		chunk(head + `{"index":0,"delta":{"role":"assistant","content":"done"},"finish_reason":null}]}`)
		chunk(head + `{"index":0,"delta":{},"finish_reason":"stop"}]}`)
	}
	chunk(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"bench","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`)
	chunk("[DONE]")
	w.(http.Flusher).Flush()
	done := time.Now()
	u.mu.Lock()
	u.requests = append(u.requests, arrived)
	u.finished = append(u.finished, done)
	u.mu.Unlock()
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkDevTenSteps runs `dsh dev -p` once per iteration and reports the
// median step gap, the launch-to-first-request time and the peak RSS, for
// the installed layout (layout=bin: the sandbox launcher beside dsh, as
// `make build` makes it) and for dsh alone (layout=single).
//
// Each iteration has a fresh data directory but they share one
// XDG_RUNTIME_DIR, as the runs of one desktop session do: the first run
// probes the sandbox and caches the verdict there, the later ones take it.
// cold-launch-ms is the first run's launch-to-first-request time.
func BenchmarkDevTenSteps(b *testing.B) {
	b.Run("layout=bin", func(b *testing.B) { benchDev(b, dshWithLauncher) })
	b.Run("layout=single", func(b *testing.B) { benchDev(b, dshBin) })
}

func benchDev(b *testing.B, dshBin string) {
	var gaps, launches, exits []time.Duration
	var rss []int64
	runtimeDir := b.TempDir()
	for b.Loop() {
		u := &upstream{}
		srv := httptest.NewServer(u)
		dir := b.TempDir()
		cmd := exec.Command(dshBin, "dev", "-p", "run ten echo commands", "--data", filepath.Join(dir, ".dsh"),
			"--agent-listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--toolhost-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--yes")
		cmd.Dir = dir
		cmd.Env = append(cleanEnv(), "OPENAI_API_KEY=bench", "OPENAI_BASE_URL="+srv.URL+"/v1", "OPENAI_MODEL=bench", "XDG_RUNTIME_DIR="+runtimeDir)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		launched := time.Now()
		if err := cmd.Run(); err != nil {
			srv.Close()
			b.Fatalf("dsh dev -p: %v\n%s", err, out.String())
		}
		exited := time.Now()
		srv.Close()
		if !strings.Contains(out.String(), "done") {
			b.Fatalf("no answer:\n%s", out.String())
		}
		u.mu.Lock()
		if len(u.requests) != steps+1 {
			b.Fatalf("upstream saw %d requests, want %d", len(u.requests), steps+1)
		}
		launches = append(launches, u.requests[0].Sub(launched))
		exits = append(exits, exited.Sub(u.finished[len(u.finished)-1]))
		for i := 1; i < len(u.requests); i++ {
			gaps = append(gaps, u.requests[i].Sub(u.finished[i-1]))
		}
		u.mu.Unlock()
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			rss = append(rss, ru.Maxrss) // KiB on Linux
		}
	}
	b.ReportMetric(float64(median(gaps).Microseconds())/1000, "gap-ms/step")
	b.ReportMetric(float64(median(launches).Microseconds())/1000, "launch-to-first-request-ms")
	if len(launches) > 0 {
		b.ReportMetric(float64(launches[0].Microseconds())/1000, "cold-launch-ms")
	}
	b.ReportMetric(float64(median(exits).Microseconds())/1000, "answer-to-exit-ms")
	if len(rss) > 0 {
		slices.Sort(rss)
		b.ReportMetric(float64(rss[len(rss)-1])/1024, "peak-rss-MiB")
	}
	b.ReportMetric(0, "ns/op")
}

// cleanEnv drops provider keys and dsh settings from the environment.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasSuffix(k, "_API_KEY") || strings.HasPrefix(k, "OPENAI_") || strings.HasPrefix(k, "DSH_") || strings.HasPrefix(k, "OTEL_") || k == "XDG_RUNTIME_DIR" {
			continue
		}
		out = append(out, kv)
	}
	return out
}
