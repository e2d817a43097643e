package cmdline

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestNoArgs(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--listen", "x"}, ""},
		{[]string{"stray", "--listen", "x"}, `unexpected argument "stray": agent takes flags only`},
		{[]string{"--listen", "x", "--", "--listen"}, `unexpected argument "--listen"`},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.String("listen", "", "")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		err := NoArgs(fs)
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("NoArgs after %q = %v, want %q", tt.args, err, tt.wantErr)
		}
	}
}

// TestEnv: unset and empty variables give the default; well-formed values
// are taken (a duration may be a bare number of seconds, as the agent's
// always could); a value that does not parse gives the default and an
// error naming the variable, the value and the form expected.
func TestEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		value   string
		read    func(e *Env, k string) any
		want    any
		wantErr string // "" = no error
	}{
		{"string unset", "", func(e *Env, k string) any { return e.String(k, "def") }, "def", ""},
		{"string set", "x", func(e *Env, k string) any { return e.String(k, "def") }, "x", ""},
		{"bool unset", "", func(e *Env, k string) any { return e.Bool(k, true) }, true, ""},
		{"bool 1", "1", func(e *Env, k string) any { return e.Bool(k, false) }, true, ""},
		{"bool TRUE", "TRUE", func(e *Env, k string) any { return e.Bool(k, false) }, true, ""},
		{"bool yes", "yes", func(e *Env, k string) any { return e.Bool(k, false) }, true, ""},
		{"bool false", "false", func(e *Env, k string) any { return e.Bool(k, true) }, false, ""},
		{"bool Off", "Off", func(e *Env, k string) any { return e.Bool(k, true) }, false, ""},
		{"bool bad", "maybe", func(e *Env, k string) any { return e.Bool(k, true) }, true, `DSH_X="maybe": not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means true`},
		{"int unset", "", func(e *Env, k string) any { return e.Int(k, 64) }, 64, ""},
		{"int set", "-1", func(e *Env, k string) any { return e.Int(k, 64) }, -1, ""},
		{"int bad", "lots", func(e *Env, k string) any { return e.Int(k, 64) }, 64, `DSH_X="lots": not a decimal integer; unset means 64`},
		{"int with a unit", "1GiB", func(e *Env, k string) any { return e.Int(k, 0) }, 0, `DSH_X="1GiB": not a decimal integer; unset means 0`},
		{"int64 set", "1073741824", func(e *Env, k string) any { return e.Int64(k, 0) }, int64(1 << 30), ""},
		{"int64 too large", "99999999999999999999", func(e *Env, k string) any { return e.Int64(k, 7) }, int64(7), `DSH_X="99999999999999999999": out of range for a 64-bit integer; unset means 7`},
		{"duration unset", "", func(e *Env, k string) any { return e.Duration(k, 2*time.Millisecond) }, 2 * time.Millisecond, ""},
		{"duration with unit", "1m30s", func(e *Env, k string) any { return e.Duration(k, 0) }, 90 * time.Second, ""},
		{"duration zero", "0", func(e *Env, k string) any { return e.Duration(k, time.Second) }, time.Duration(0), ""},
		{"duration bare seconds", "30", func(e *Env, k string) any { return e.Duration(k, 0) }, 30 * time.Second, ""},
		{"duration bad", "fast", func(e *Env, k string) any { return e.Duration(k, 2*time.Millisecond) }, 2 * time.Millisecond,
			`DSH_X="fast": not a duration (a number with a unit, e.g. 500ms, 90s or 1h30m; a bare number is seconds); unset means 2ms`},
		{"duration bare seconds overflow", "99999999999", func(e *Env, k string) any { return e.Duration(k, time.Second) }, time.Second, `DSH_X="99999999999": not a duration`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := NewEnv(func(k string) string { return map[string]string{"DSH_X": tt.value}[k] })
			if got := tt.read(e, "DSH_X"); got != tt.want {
				t.Errorf("got %v (%T), want %v (%T)", got, got, tt.want, tt.want)
			}
			err := e.Err()
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Err() = %v, want %q", err, tt.wantErr)
			}
			var ee *EnvError
			if err != nil && (!errors.As(err, &ee) || ee.Name != "DSH_X" || ee.Value != tt.value) {
				t.Errorf("Err() = %#v, want an *EnvError naming DSH_X=%q", err, tt.value)
			}
		})
	}
}

// TestEnvJoinsEveryBadVariable: each malformed variable is named, not only
// the first.
func TestEnvJoinsEveryBadVariable(t *testing.T) {
	t.Parallel()
	env := map[string]string{"A": "x", "B": "", "C": "y"}
	e := NewEnv(func(k string) string { return env[k] })
	e.Duration("A", 0)
	e.Int("B", 1)
	e.Bool("C", false)
	got := e.Err().Error()
	if want := "A=\"x\": not a duration (a number with a unit, e.g. 500ms, 90s or 1h30m; a bare number is seconds); unset means 0s\n" +
		"C=\"y\": not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means false"; got != want {
		t.Errorf("Err() =\n%s\nwant\n%s", got, want)
	}
}
