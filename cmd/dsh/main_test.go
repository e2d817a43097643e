package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCommandLine(t *testing.T) {
	t.Parallel()
	closed := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}()
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "no command", args: nil, wantCode: 2, wantStderr: "Usage: dsh <command>"},
		{name: "help", args: []string{"--help"}, wantCode: 0, wantStdout: "Commands:"},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantStderr: `unknown command "frobnicate"`},
		{name: "subcommand help", args: []string{"dev", "--help"}, wantCode: 0, wantStderr: "-p string"},
		{name: "bad flag", args: []string{"chat", "--nope"}, wantCode: 2, wantStderr: "flag provided but not defined"},
		{name: "send without prompt", args: []string{"send", "--addr", closed}, wantCode: 2, wantStderr: "no prompt given"},
		{name: "send with empty stdin", args: []string{"send", "--addr", closed, "-"}, stdin: "  \n", wantCode: 2, wantStderr: "no prompt given"},
		{name: "no agent", args: []string{"sessions", "list", "--addr", closed}, wantCode: 1, wantStderr: "no agent service at " + closed},
		{name: "sessions show needs an id", args: []string{"sessions", "show", "--addr", closed}, wantCode: 2, wantStderr: "needs a session id"},
		{name: "unknown sessions command", args: []string{"sessions", "zap"}, wantCode: 2, wantStderr: `unknown sessions command "zap"`},
		{name: "tools usage", args: []string{"tools"}, wantCode: 2, wantStderr: "usage: dsh tools list"},
		{name: "no gateway", args: []string{"models", "list", "--addr", closed}, wantCode: 1, wantStderr: "no LLM gateway at " + closed},
		{name: "bad nats url", args: []string{"events", "tail", "--nats", "http://x:1"}, wantCode: 2, wantStderr: `--nats "http://x:1": scheme "http"`},
		{name: "flag after the id", args: []string{"sessions", "events", "some-id", "--addr", closed}, wantCode: 1, wantStderr: "no agent service at " + closed},
		{name: "flag after the subcommand word", args: []string{"sessions", "list", "--addr", closed, "--limit", "3"}, wantCode: 2, wantStderr: "flag provided but not defined: -limit"},
		{name: "dash dash ends flags", args: []string{"sessions", "show", "--addr", closed, "--", "--addr"}, wantCode: 1, wantStderr: "no agent service at " + closed},
		{name: "version", args: []string{"--version"}, wantCode: 0, wantStdout: "dsh "},
		{name: "version after a subcommand", args: []string{"sessions", "list", "--addr", closed, "--version"}, wantCode: 0, wantStdout: "dsh "},
		{name: "version word", args: []string{"version"}, wantCode: 0, wantStdout: " go1."},
		{name: "dev stray argument", args: []string{"dev", "hello"}, wantCode: 2, wantStderr: "use -p"},
		// A variable that does not parse stops dsh dev before it starts,
		// naming it; a well-formed one is taken (on to the next check).
		{name: "dev malformed gateway variable", args: []string{"dev", "hello"}, env: map[string]string{"DSH_LLM_IDLE_TIMEOUT": "soon"}, wantCode: 2,
			wantStderr: `dsh: DSH_LLM_IDLE_TIMEOUT="soon": not a duration (a number with a unit, e.g. 500ms, 90s or 1h30m; a bare number is seconds); unset means 5m0s`},
		{name: "dev well-formed gateway variable", args: []string{"dev", "hello"}, env: map[string]string{"DSH_LLM_IDLE_TIMEOUT": "90"}, wantCode: 2, wantStderr: "use -p"},
		{name: "dev malformed DSH_DEBUG", args: []string{"dev", "hello"}, env: map[string]string{"DSH_DEBUG": "verbose"}, wantCode: 2,
			wantStderr: `dsh: DSH_DEBUG="verbose": not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means false`},
		{name: "dev empty DSH_DEBUG", args: []string{"dev", "hello"}, env: map[string]string{"DSH_DEBUG": ""}, wantCode: 2, wantStderr: "use -p"},
		{name: "dev well-formed DSH_DEBUG", args: []string{"dev", "hello"}, env: map[string]string{"DSH_DEBUG": "1"}, wantCode: 2, wantStderr: "use -p"},
		{name: "dev malformed variables all named", args: []string{"dev", "hello"}, env: map[string]string{"DSH_DEBUG": "verbose", "DSH_LLM_IDLE_TIMEOUT": "soon"}, wantCode: 2,
			wantStderr: "dsh: DSH_LLM_IDLE_TIMEOUT=\"soon\": not a duration (a number with a unit, e.g. 500ms, 90s or 1h30m; a bare number is seconds); unset means 5m0s\nDSH_DEBUG=\"verbose\": not a boolean"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			e := &env{stdin: strings.NewReader(tt.stdin), stdout: &stdout, stderr: &stderr, args: tt.args,
				getenv: func(k string) string { return tt.env[k] }}
			code := exitCode(e, run(t.Context(), e))
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q lacks %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

// dsh dev has neither TLS nor authentication: it refuses to listen beyond
// loopback.
func TestDevListensOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		if lis, err := listen(addr, defaultAgentAddr); err == nil || !strings.Contains(err.Error(), "loopback") {
			if lis != nil {
				lis.Close()
			}
			t.Errorf("listen(%s) = %v, want a loopback-only refusal", addr, err)
		}
	}
	lis, err := listen("127.0.0.1:0", defaultAgentAddr)
	if err != nil {
		t.Fatal(err)
	}
	lis.Close()
}

// --token never travels in plaintext beyond loopback.
func TestTokenNeedsTLSBeyondLoopback(t *testing.T) {
	t.Parallel()
	cf := &clientFlags{token: "secret"}
	if _, err := cf.dialOptions("10.1.2.3:7700"); err == nil || !strings.Contains(err.Error(), "--tls-ca") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("plaintext token to a remote agent: %v", err)
	}
	if opts, err := cf.dialOptions("127.0.0.1:7700"); err != nil || len(opts) != 1 {
		t.Fatalf("token to a loopback agent: %v %v", opts, err)
	}
}

// TestDevAgentStartErrorIsReported: the agent accepts calls before its
// start is over and the CLI sends its first call then; when the start
// fails (here the store: an unknown kind) the error dsh dev reports is the
// agent's, whether the call was waiting when it failed (answered
// UNAVAILABLE with the start's error) or reached it after its server had
// stopped (a closed connection).
func TestDevAgentStartErrorIsReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
	err := runDev(t.Context(), e, []string{"-p", "hello", "--store", "bogus", "--data", filepath.Join(dir, ".dsh"), "--agent-listen", "127.0.0.1:0",
		"--gateway-listen", "127.0.0.1:0", "--toolhost-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), `unknown store "bogus"`) {
		t.Fatalf("runDev with --store bogus = %v, want the agent's store error", err)
	}
}

// TestRunningAgentExplain: explain turns the failure of one of the CLI's
// first calls into the agent's own error when its start failed (the call
// then saw only a refused or closed connection), leaving that error for
// stop; once the agent has started, or when ctx ends first, the call's own
// error is the one to report. Deterministic: TestDevAgentStartErrorIsReported
// reaches explain only when its call lost the race with the failed start.
func TestRunningAgentExplain(t *testing.T) {
	t.Parallel()
	refused := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7700: connect: connection refused"`)
	startErr := errors.New("x")
	tests := []struct {
		name     string
		failed   bool // done holds startErr
		started  bool // ready closed
		ctxEnded bool
		want     string
	}{
		{name: "start failed", failed: true, want: "agent: x"},
		{name: "started", started: true, want: refused.Error()},
		{name: "ctx ended first", ctxEnded: true, want: refused.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := &runningAgent{accepting: make(chan struct{}), ready: make(chan struct{}), done: make(chan error, 1)}
			if tt.failed {
				a.done <- startErr
			}
			if tt.started {
				close(a.ready)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.ctxEnded {
				cancel()
			}
			got := a.explain(ctx, refused)
			if got == nil || got.Error() != tt.want {
				t.Fatalf("explain = %v, want %q", got, tt.want)
			}
			if tt.failed {
				if !errors.Is(got, startErr) {
					t.Errorf("explain = %v does not wrap the start's error", got)
				}
				select {
				case err := <-a.done:
					if err != startErr {
						t.Errorf("done holds %v after explain, want the start's error back for stop", err)
					}
				default:
					t.Error("explain took the start's error from done without putting it back for stop")
				}
			} else if !errors.Is(got, refused) {
				t.Errorf("explain = %v, want the call's own error", got)
			}
		})
	}
}

// The agent starts before the gateway and the toolhost are built (issue 19):
// a start that fails after it (here the gateway: its script file is
// missing) stops it again and closes its port, rather than leaving it
// serving beside an error.
func TestDevFailedStartStopsTheAgent(t *testing.T) {
	// Not parallel: it reads the process's GOGC, which every dsh dev start
	// in this process sets while it starts (TestDevAgentStartErrorIsReported
	// and the others run in parallel after the serial tests).
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(k string) string {
		if k == "DSH_SCRIPT" {
			return filepath.Join(dir, "missing-script.json")
		}
		return ""
	}}
	gogc := gcPercent()
	err = runDev(t.Context(), e, []string{"-p", "hello", "--data", filepath.Join(dir, ".dsh"), "--agent-listen", addr,
		"--gateway-listen", "127.0.0.1:0", "--toolhost-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "gateway") || !strings.Contains(err.Error(), "missing-script.json") {
		t.Fatalf("runDev with a missing script = %v, want the gateway's error naming the file", err)
	}
	// The start's collector setting (startHeapGoal) is put back.
	if got := gcPercent(); got != gogc {
		t.Errorf("after a failed start the collector runs at GOGC %d, want %d as before", got, gogc)
	}
	// The agent's first ListTools, cancelled by the failed start, is not a
	// toolhost going down.
	if strings.Contains(stderr.String(), "toolhost") {
		t.Errorf("a failed start reports a host state it never saw:\n%s", stderr.String())
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("the agent still accepts connections at %s after the failed start", addr)
	}
}
