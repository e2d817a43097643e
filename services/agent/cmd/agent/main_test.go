package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestVariables: the agent's flags default from their variables. Unset and
// empty variables give the defaults; every well-formed value is taken (a
// bare number of seconds for a duration, as before); a flag given wins. A
// value that does not parse stops the agent with one line naming the
// variable, its value and the form expected, even when the flag it
// defaults is given, where it used to mean the default in silence.
func TestVariables(t *testing.T) {
	t.Parallel()
	type got struct {
		CommitDelay, LeaseTTL, ConnAge time.Duration
		MaxQueued                      int
		NATSMaxBytes                   int64
		Debug, Insecure                bool
	}
	defaults := got{CommitDelay: 2 * time.Millisecond, LeaseTTL: 10 * time.Second, ConnAge: 5 * time.Minute, MaxQueued: 100}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    got
		wantErr []string // the lines of the error; nil: none
	}{
		{name: "unset", want: defaults},
		{name: "empty", env: map[string]string{"DSH_SQLITE_COMMIT_DELAY": "", "DSH_LEASE_TTL": "", "DSH_MAX_CONNECTION_AGE": "", "DSH_MAX_QUEUED": "",
			"DSH_NATS_STREAM_MAX_BYTES": "", "DSH_DEBUG": "", "DSH_INSECURE": ""}, want: defaults},
		{name: "well-formed", env: map[string]string{"DSH_SQLITE_COMMIT_DELAY": "5ms", "DSH_LEASE_TTL": "30", "DSH_MAX_CONNECTION_AGE": "1m", "DSH_MAX_QUEUED": "-1",
			"DSH_NATS_STREAM_MAX_BYTES": "1073741824", "DSH_DEBUG": "true", "DSH_INSECURE": "1"},
			want: got{CommitDelay: 5 * time.Millisecond, LeaseTTL: 30 * time.Second, ConnAge: time.Minute, MaxQueued: -1, NATSMaxBytes: 1 << 30, Debug: true, Insecure: true}},
		{name: "booleans turned off", env: map[string]string{"DSH_DEBUG": "false", "DSH_INSECURE": "0"}, want: defaults},
		{name: "flags win", env: map[string]string{"DSH_LEASE_TTL": "30s", "DSH_MAX_QUEUED": "5", "DSH_DEBUG": "on"},
			args: []string{"--lease-ttl", "1m", "--max-queued", "7", "--debug=false"}, want: func() got { g := defaults; g.LeaseTTL, g.MaxQueued = time.Minute, 7; return g }()},

		{name: "duration", env: map[string]string{"DSH_SQLITE_COMMIT_DELAY": "fast"},
			wantErr: []string{`DSH_SQLITE_COMMIT_DELAY="fast": not a duration (a number with a unit, e.g. 500ms, 90s or 1h30m; a bare number is seconds); unset means 2ms`}},
		{name: "duration under its flag", env: map[string]string{"DSH_SQLITE_COMMIT_DELAY": "fast"}, args: []string{"--sqlite-commit-delay", "1ms"},
			wantErr: []string{`DSH_SQLITE_COMMIT_DELAY="fast": not a duration`}},
		{name: "integer", env: map[string]string{"DSH_MAX_QUEUED": "lots"}, wantErr: []string{`DSH_MAX_QUEUED="lots": not a decimal integer; unset means 100`}},
		{name: "size", env: map[string]string{"DSH_NATS_STREAM_MAX_BYTES": "1GiB"}, wantErr: []string{`DSH_NATS_STREAM_MAX_BYTES="1GiB": not a decimal integer; unset means 0`}},
		{name: "boolean", env: map[string]string{"DSH_DEBUG": "verbose"}, wantErr: []string{`DSH_DEBUG="verbose": not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means false`}},
		{name: "a transport variable", env: map[string]string{"DSH_MAX_CONNECTION_AGE": "5 minutes"}, wantErr: []string{`DSH_MAX_CONNECTION_AGE="5 minutes": not a duration`}},
		{name: "an authentication variable", env: map[string]string{"DSH_JWT_REFRESH": "hourly"}, wantErr: []string{`DSH_JWT_REFRESH="hourly": not a duration`}},
		{name: "every bad variable named", env: map[string]string{"DSH_IDLE_UNLOAD": "never", "DSH_MAX_SUBAGENT_DEPTH": "deep"},
			wantErr: []string{`DSH_IDLE_UNLOAD="never": not a duration`, `DSH_MAX_SUBAGENT_DEPTH="deep": not a decimal integer`}},
		{name: "enumeration", env: map[string]string{"DSH_SANDBOX_MODE": "bogus"}, wantErr: []string{`sandbox mode "bogus": want read-only, workspace-write or danger-full-access`}},
		{name: "bare seconds still checked against the range", env: map[string]string{"DSH_SQLITE_COMMIT_DELAY": "2"},
			wantErr: []string{"--sqlite-commit-delay 2s: want 0 (commit at once) to 100ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("parseFlags = nil error, want %q", tc.wantErr)
				}
				lines := strings.Split(err.Error(), "\n")
				if len(lines) != len(tc.wantErr) {
					t.Fatalf("parseFlags = %v, want one line each: %q", err, tc.wantErr)
				}
				for i, want := range tc.wantErr {
					if !strings.HasPrefix(lines[i], want) {
						t.Errorf("line %d %q, want it to start %q", i, lines[i], want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags: %v", err)
			}
			g := got{CommitDelay: o.sc.CommitDelay, LeaseTTL: o.sc.LeaseTTL, ConnAge: o.connAge, MaxQueued: o.sc.Service.MaxQueuedItems,
				NATSMaxBytes: o.sc.NATSLimits.MaxBytes, Debug: o.sc.Service.Debug, Insecure: o.srvFlags.Insecure}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("values (-want +got):\n%s", diff)
			}
		})
	}
}
