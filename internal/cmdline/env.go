package cmdline

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// Env reads the environment variables that give a binary's flags their
// defaults. An unset or empty variable gives the default. A value that
// does not parse gives the default too, and is kept as an error: the
// binary checks Err once its flags are parsed and refuses to start, as it
// refuses a flag whose value does not parse. A flag given on the command
// line still wins over its variable, but a malformed variable is refused
// even then: the operator set something wrong.
//
// An Env belongs to one parse of one command line; it is not safe for
// concurrent use.
type Env struct {
	getenv func(string) string
	errs   []error
}

// NewEnv returns an Env reading getenv (nil: os.Getenv).
func NewEnv(getenv func(string) string) *Env {
	if getenv == nil {
		getenv = os.Getenv
	}
	return &Env{getenv: getenv}
}

// Err returns the variables read so far whose values did not parse, one
// *EnvError per variable (joined), or nil.
func (e *Env) Err() error { return errors.Join(e.errs...) }

// String is the value of k, or def when k is unset or empty.
func (e *Env) String(k, def string) string {
	if v := e.getenv(k); v != "" {
		return v
	}
	return def
}

// Bool is the boolean in k: true, 1, yes or on; false, 0, no or off (any
// case; t and f as strconv.ParseBool takes them).
func (e *Env) Bool(k string, def bool) bool {
	v := e.getenv(k)
	if v == "" {
		return def
	}
	switch strings.ToLower(v) {
	case "1", "t", "true", "yes", "on":
		return true
	case "0", "f", "false", "no", "off":
		return false
	}
	e.errs = append(e.errs, &EnvError{Name: k, Value: v,
		Reason: fmt.Sprintf("not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means %t", def)})
	return def
}

// Int is the decimal integer in k.
func (e *Env) Int(k string, def int) int {
	return int(e.integer(k, int64(def), strconv.IntSize))
}

// Int64 is the decimal 64-bit integer in k.
func (e *Env) Int64(k string, def int64) int64 {
	return e.integer(k, def, 64)
}

func (e *Env) integer(k string, def int64, bits int) int64 {
	v := e.getenv(k)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, bits)
	if err == nil {
		return n
	}
	reason := fmt.Sprintf("not a decimal integer; unset means %d", def)
	if errors.Is(err, strconv.ErrRange) {
		reason = fmt.Sprintf("out of range for a %d-bit integer; unset means %d", bits, def)
	}
	e.errs = append(e.errs, &EnvError{Name: k, Value: v, Reason: reason, Err: err})
	return def
}

// Duration is the duration in k: a Go duration (a number with a unit:
// 500ms, 90s, 1h30m) or a bare integer, taken as seconds.
func (e *Env) Duration(k string, def time.Duration) time.Duration {
	v := e.getenv(k)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err == nil {
		return d
	}
	if n, nerr := strconv.ParseInt(v, 10, 64); nerr == nil {
		if n <= math.MaxInt64/int64(time.Second) && n >= math.MinInt64/int64(time.Second) {
			return time.Duration(n) * time.Second
		}
		err = strconv.ErrRange
	}
	e.errs = append(e.errs, &EnvError{Name: k, Value: v, Err: err,
		Reason: fmt.Sprintf("not a duration (a number with a unit, e.g. 500ms, 90s or 1h30m; a bare number is seconds); unset means %v", def)})
	return def
}

// EnvError is an environment variable whose value does not parse.
type EnvError struct {
	// Name is the variable, e.g. DSH_SQLITE_COMMIT_DELAY.
	Name string
	// Value is its value.
	Value string
	// Reason says what is wrong, the form expected and the default.
	Reason string
	// Err is the parser's error, if any.
	Err error
}

func (e *EnvError) Error() string { return fmt.Sprintf("%s=%q: %s", e.Name, e.Value, e.Reason) }

func (e *EnvError) Unwrap() error { return e.Err }
