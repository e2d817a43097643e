package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/proctest"
)

// TestDebugAddr: --debug-addr serves Prometheus metrics and pprof (the
// instruments themselves are checked in internal/debugserver); a
// non-loopback address is refused without --debug-allow-remote.
func TestDebugAddr(t *testing.T) {
	t.Parallel()
	env := func(string) string { return "" }
	err := run(t.Context(), []string{"--listen", "127.0.0.1:0", "--debug-addr", "0.0.0.0:0"}, env, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "--debug-allow-remote") {
		t.Fatalf("non-loopback --debug-addr: got %v, want a refusal", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs proctest.Buffer
	addrc, errc := make(chan string, 1), make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--listen", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"}, env, &logs, func(a string) { addrc <- a })
	}()
	select {
	case <-addrc:
	case err := <-errc:
		t.Fatalf("run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	m := regexp.MustCompile(`debug server listening.*addr=(127\.0\.0\.1:\d+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no debug address logged:\n%s", logs.String())
	}
	for path, want := range map[string]string{"/metrics": "go_goroutines", "/debug/pprof/goroutine?debug=1": "goroutine profile"} {
		resp, err := http.Get("http://" + m[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, want %q in:\n%.300s", path, resp.Status, want, body)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v", err)
	}
}
