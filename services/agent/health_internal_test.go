package agent

import (
	"context"
	"errors"
	"log/slog"
	"testing"
)

type flakyStore struct{ err error }

func (f *flakyStore) Ping(context.Context) error { return f.err }

type statuses map[string]bool

func (s statuses) SetStatus(name string, serving bool) { s[name] = serving }

// TestStoreHealth: the agent as a whole follows its store; a toolhost's
// status is its own; statuses set before the server exists reach it.
func TestStoreHealth(t *testing.T) {
	st := &flakyStore{}
	d := newDepHealth(st, slog.New(slog.DiscardHandler))
	d.probeStore(t.Context())
	d.set(HealthToolhost("box"), false)
	got := statuses{}
	d.attach(got)
	tests := []struct {
		name    string
		err     error
		serving bool
	}{
		{"up", nil, true},
		{"down", errors.New("disk gone"), false},
		{"back", nil, true},
	}
	for _, tt := range tests {
		st.err = tt.err
		d.probeStore(t.Context())
		for _, n := range []string{"", HealthService, HealthStore} {
			if got[n] != tt.serving {
				t.Errorf("%s: %q serving=%v, want %v", tt.name, n, got[n], tt.serving)
			}
		}
		if got[HealthToolhost("box")] {
			t.Errorf("%s: the toolhost's status followed the store", tt.name)
		}
		if tt.name != "up" {
			continue
		}
		// A probe cancelled by its caller records nothing: the store
		// still reads serving though its ping failed.
		st.err = context.Canceled
		cctx, cancel := context.WithCancel(t.Context())
		cancel()
		d.probeStore(cctx)
		for _, n := range []string{"", HealthService, HealthStore} {
			if !got[n] {
				t.Errorf("a cancelled probe: %q serving=false, want the last probe's true", n)
			}
		}
	}
	// A store that cannot be probed counts as up.
	d = newDepHealth(struct{}{}, slog.New(slog.DiscardHandler))
	d.probeStore(t.Context())
	if !d.status[HealthService] {
		t.Error("an unprobeable store made the agent NOT_SERVING")
	}
}
