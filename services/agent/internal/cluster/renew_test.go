package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/persistence/pgstore"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
)

// racingLeases is a lease table whose renewal, once armed, stops in the
// middle (after it decided which leases are lost) until the test has done
// what it wants to race with it.
type racingLeases struct {
	mu      sync.Mutex
	epoch   int64
	armed   bool
	inRenew chan struct{} // closed when an armed renewal is running
	resume  chan struct{} // the armed renewal returns once it is closed
}

func (l *racingLeases) Claim(_ context.Context, id, address string, _ time.Duration) (pgstore.Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epoch++
	return pgstore.Lease{SessionID: id, Address: address, Epoch: l.epoch}, nil
}

func (l *racingLeases) RenewHeld(_ context.Context, ids []string, _ time.Duration) ([]string, error) {
	l.mu.Lock()
	armed := l.armed
	l.armed = false
	l.mu.Unlock()
	if !armed {
		return nil, nil
	}
	// The store found these leases gone (a release raced the renewal).
	close(l.inRenew)
	<-l.resume
	return ids, nil
}

func (l *racingLeases) Release(context.Context, string) error { return nil }

func (l *racingLeases) Lookup(context.Context, string) (pgstore.Lease, error) {
	return pgstore.Lease{}, nil
}

// TestRenewalLosesOnlyTheLeaseItRenewed: a renewal that finds a session's
// lease gone (its turn ended and released it) must not drop the session
// when, while the renewal ran, this replica claimed it again with a new
// epoch: the new lease is live, and dropping it would stop a running turn
// and let the lease lapse. A lease that is really lost is still dropped.
func TestRenewalLosesOnlyTheLeaseItRenewed(t *testing.T) {
	tests := []struct {
		name      string
		reclaim   bool // release and claim again while the renewal runs
		wantHeld  bool
		wantLosts int
	}{
		{"claimed again during the renewal", true, true, 0},
		{"really lost", false, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			leases := &racingLeases{inRenew: make(chan struct{}), resume: make(chan struct{})}
			var mu sync.Mutex
			losts := 0
			m := cluster.New(leases, cluster.Config{Address: "a:1", OnLost: func(string, error) {
				mu.Lock()
				losts++
				mu.Unlock()
			}})
			if _, err := m.Acquire(ctx, "s1"); err != nil {
				t.Fatal(err)
			}
			leases.mu.Lock()
			leases.armed = true
			leases.mu.Unlock()
			done := make(chan error, 1)
			go func() { done <- m.RenewAll(ctx) }()
			<-leases.inRenew
			if tc.reclaim {
				if err := m.Release(ctx, "s1"); err != nil {
					t.Fatal(err)
				}
				if _, err := m.Acquire(ctx, "s1"); err != nil {
					t.Fatal(err)
				}
			}
			close(leases.resume)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := m.Holds("s1"); got != tc.wantHeld {
				t.Errorf("after the renewal Holds = %v, want %v", got, tc.wantHeld)
			}
			// OnLost runs on its own goroutine: wait for the one expected,
			// then make sure no other comes.
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				n := losts
				mu.Unlock()
				if n >= tc.wantLosts || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if losts != tc.wantLosts {
				t.Errorf("OnLost called %d times, want %d", losts, tc.wantLosts)
			}
		})
	}
}
