package debugserver_test

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/debugserver"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// TestRefusesRemoteAddress: the endpoint has no authentication, so an
// address other hosts can reach needs the explicit flag (or its variable
// set to a true value; a value that is not a boolean is an error naming
// it).
func TestRefusesRemoteAddress(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		refused bool
		envErr  string // the error of the variables, "" = none
	}{
		{args: nil},
		{args: []string{"--debug-addr", "127.0.0.1:6060"}},
		{args: []string{"--debug-addr", "[::1]:0"}},
		{args: []string{"--debug-addr", "localhost:6060"}},
		{args: []string{"--debug-addr", ":6060"}, refused: true},
		{args: []string{"--debug-addr", "0.0.0.0:6060"}, refused: true},
		{args: []string{"--debug-addr", "10.1.2.3:6060"}, refused: true},
		{args: []string{"--debug-addr", "metrics.internal:6060"}, refused: true},
		{env: map[string]string{debugserver.EnvAddr: "0.0.0.0:6060"}, refused: true},
		{args: []string{"--debug-addr", "0.0.0.0:6060", "--debug-allow-remote"}},
		{env: map[string]string{debugserver.EnvAddr: "0.0.0.0:6060", debugserver.EnvAllowRemote: "1"}},
		{env: map[string]string{debugserver.EnvAddr: "0.0.0.0:6060", debugserver.EnvAllowRemote: ""}, refused: true},
		{env: map[string]string{debugserver.EnvAddr: "0.0.0.0:6060", debugserver.EnvAllowRemote: "false"}, refused: true},
		{env: map[string]string{debugserver.EnvAddr: "0.0.0.0:6060", debugserver.EnvAllowRemote: "please"}, refused: true,
			envErr: `DSH_DEBUG_ALLOW_REMOTE="please": not a boolean`},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var f debugserver.Flags
		env := cmdline.NewEnv(func(k string) string { return tc.env[k] })
		f.RegisterFlags(fs, env)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := env.Err(); (err == nil) != (tc.envErr == "") || (err != nil && !strings.Contains(err.Error(), tc.envErr)) {
			t.Errorf("%v %v: variables' error %v, want %q", tc.args, tc.env, err, tc.envErr)
		}
		exp, err := f.Setup()
		switch {
		case tc.refused && (err == nil || !strings.Contains(err.Error(), "--debug-allow-remote")):
			t.Errorf("%v %v: got %v, want a refusal naming --debug-allow-remote", tc.args, tc.env, err)
		case !tc.refused && err != nil:
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		case !tc.refused && (exp == nil) != (f.Addr == ""):
			t.Errorf("%v %v: exporter %v for address %q", tc.args, tc.env, exp, f.Addr)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}

// TestServesMetricsAndProfiles records the throughput instruments through
// the exporter's reader and reads them back as Prometheus text, then takes
// a heap profile.
func TestServesMetricsAndProfiles(t *testing.T) {
	exp, err := debugserver.NewExporter()
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp.Reader))
	defer mp.Shutdown(context.Background())
	sm, err := telemetry.NewStoreMetrics(mp, func() int64 { return 7 })
	if err != nil {
		t.Fatal(err)
	}
	sm.RecordCommit(t.Context(), 5, 3*time.Millisecond, []time.Duration{time.Millisecond, 2 * time.Millisecond})
	chunks, err := telemetry.NewChunkCounter(mp)
	if err != nil {
		t.Fatal(err)
	}
	chunks.Add(t.Context(), 42)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addr, err := exp.Serve(ctx, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr.String()
	text := get(t, base+"/metrics")
	for _, want := range []string{
		`dsh_store_commit_requests_bucket{`,
		`dsh_store_commit_requests_sum{otel_scope_name="github.com/dsh-dev/dsh"`,
		`dsh_store_write_duration_seconds_count{`,
		`dsh_store_queue{`,
		`dsh_gateway_chunks_total{`,
		"go_goroutines ",
		"process_cpu_seconds_total ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(text, "dsh_gateway_chunks_total{") || !strings.Contains(text, "} 42") {
		t.Errorf("chunk counter not 42:\n%s", text)
	}
	if heap := get(t, base+"/debug/pprof/heap?debug=1"); !strings.Contains(heap, "heap profile") {
		t.Errorf("heap profile: %.200s", heap)
	}
	if idx := get(t, base+"/debug/pprof/"); !strings.Contains(idx, "goroutine") {
		t.Errorf("pprof index: %.200s", idx)
	}
	cancel()
	// After ctx ends the server is closed.
	for range 100 {
		if _, err := http.Get(base + "/metrics"); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond) // the close runs on AfterFunc's goroutine
	}
	t.Error("debug server still serving after its context ended")
}
