// Package cluster is session ownership for agent replicas sharing a
// PostgreSQL store: a replica claims a session's lease before it loads or
// creates it, renews every lease it holds while it drives the session, and
// gives them up on shutdown. A lease names the owner's advertised address
// (where peers forward the session's RPCs) and carries an epoch that every
// append checks inside its transaction (see pgstore), so a paused or
// partitioned former owner can never write after another replica claimed
// the session: its append fails with persistence.ErrFenced, the renewal
// loop reports the loss, and the agent drops the session.
//
// The package holds the policy (when to claim, how long a lease lasts, when
// to renew, what to do on loss); the store holds the rows.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/pgstore"
)

// Leases is the lease table (pgstore.Store with an Owner implements it).
type Leases interface {
	Claim(ctx context.Context, id, address string, ttl time.Duration) (pgstore.Lease, error)
	RenewHeld(ctx context.Context, ids []string, ttl time.Duration) (lost []string, err error)
	Release(ctx context.Context, id string) error
	Lookup(ctx context.Context, id string) (pgstore.Lease, error)
}

// DefaultTTL is a lease's lifetime without renewal: how long a dead
// replica's sessions wait before another replica may claim them.
const DefaultTTL = 10 * time.Second

// Config configures a Manager.
type Config struct {
	// Address is this replica's --advertise address, stored in its leases.
	Address string
	// TTL is the lease lifetime (default DefaultTTL); Renew the renewal
	// period (default TTL/3).
	TTL, Renew time.Duration
	// OnLost is called (on its own goroutine: it may be reported from
	// inside an append) when a held lease turned out to be lost: the caller
	// must drop the session and stop its turn.
	OnLost func(id string, err error)
	// OnClaim, when set, is called after every successful claim (the agent
	// has the event fan-out catch up what a previous owner left
	// unpublished).
	OnClaim func(id string)
	// Logger; nil discards.
	Logger *slog.Logger
}

// OwnedElsewhereError reports a session whose live lease another replica
// holds: forward the call to Address.
type OwnedElsewhereError struct {
	SessionID, Owner, Address string
}

func (e *OwnedElsewhereError) Error() string {
	return fmt.Sprintf("session %q is served by replica %q at %s", e.SessionID, e.Owner, e.Address)
}

// Manager claims, renews and releases this replica's leases.
type Manager struct {
	leases Leases
	cfg    Config
	log    *slog.Logger

	mu       sync.Mutex
	held     map[string]int64 // session -> epoch
	renewErr error            // the last renewal's failure; nil after a success

	stop    chan struct{}
	done    chan struct{}
	started bool
}

// New returns a Manager; Start runs its renewal loop.
func New(leases Leases, cfg Config) *Manager {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Renew <= 0 {
		cfg.Renew = cfg.TTL / 3
	}
	m := &Manager{leases: leases, cfg: cfg, log: cfg.Logger, held: make(map[string]int64),
		stop: make(chan struct{}), done: make(chan struct{})}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	return m
}

// Acquire claims the session's lease for this replica (raising its epoch)
// unless another replica holds a live one (*OwnedElsewhereError). After it
// the caller loads the session, which repairs what a previous owner left
// open, or creates it.
func (m *Manager) Acquire(ctx context.Context, id string) (pgstore.Lease, error) {
	m.mu.Lock()
	addr := m.cfg.Address
	m.mu.Unlock()
	l, err := m.leases.Claim(ctx, id, addr, m.cfg.TTL)
	var held *pgstore.HeldError
	if errors.As(err, &held) {
		return pgstore.Lease{}, &OwnedElsewhereError{SessionID: id, Owner: held.Lease.Owner, Address: held.Lease.Address}
	}
	if err != nil {
		return pgstore.Lease{}, err
	}
	m.mu.Lock()
	m.held[id] = l.Epoch
	m.mu.Unlock()
	if m.cfg.OnClaim != nil {
		m.cfg.OnClaim(id)
	}
	return l, nil
}

// SetAddress sets the address later claims advertise (a replica that
// listens on port 0 learns it after the Manager exists).
func (m *Manager) SetAddress(addr string) {
	m.mu.Lock()
	m.cfg.Address = addr
	m.mu.Unlock()
}

// Holds reports whether this replica believes it holds the session's lease
// (the store's fence has the last word).
func (m *Manager) Holds(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.held[id]
	return ok
}

// Release gives the session's lease up (after its turn ended), so the next
// replica can claim it at once.
func (m *Manager) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	delete(m.held, id)
	m.mu.Unlock()
	return m.leases.Release(ctx, id)
}

// RenewAll renews every held lease once (one statement for all of them).
// A lease found lost is dropped and reported to OnLost; a failure (the
// database unreachable) is returned and retried at the next period, the
// leases still held until their fence says otherwise.
func (m *Manager) RenewAll(ctx context.Context) error {
	m.mu.Lock()
	ids := make([]string, 0, len(m.held))
	epochs := make(map[string]int64, len(m.held))
	for id, e := range m.held {
		ids = append(ids, id)
		epochs[id] = e
	}
	m.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	lost, err := m.leases.RenewHeld(ctx, ids, m.cfg.TTL)
	if err != nil {
		err = fmt.Errorf("renew %d leases: %w", len(ids), err)
	}
	m.mu.Lock()
	m.renewErr = err
	m.mu.Unlock()
	for _, id := range lost {
		// Only the lease this renewal was for: while it ran, the session
		// may have been released (its turn ended) and claimed again with
		// a new epoch, and that lease is not lost.
		m.lostEpoch(id, epochs[id], fmt.Errorf("session %q: lease lost: %w", id, persistence.ErrFenced))
	}
	return err
}

// Err reports why lease renewal is failing: the last renewal's error, nil
// once a renewal succeeds again (or when there was nothing to renew). The
// agent's health turns NOT_SERVING while it is set.
func (m *Manager) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.renewErr
}

// Lost records that the session's lease is gone (an append or renewal was
// fenced) and tells OnLost.
func (m *Manager) Lost(id string, err error) { m.lost(id, err) }

func (m *Manager) lost(id string, err error) { m.lostEpoch(id, anyEpoch, err) }

// anyEpoch makes lostEpoch drop whatever lease of the session is held.
const anyEpoch = -1

// lostEpoch drops the session's lease if it is held with epoch (any epoch
// for anyEpoch) and tells OnLost.
func (m *Manager) lostEpoch(id string, epoch int64, err error) {
	m.mu.Lock()
	e, had := m.held[id]
	had = had && (epoch == anyEpoch || e == epoch)
	if had {
		delete(m.held, id)
	}
	m.mu.Unlock()
	if !had {
		return
	}
	m.log.Warn("cluster: lost a session's lease; dropping it", "session", id, "error", err)
	if m.cfg.OnLost != nil {
		go m.cfg.OnLost(id, err)
	}
}

// Start runs the renewal loop until Close.
func (m *Manager) Start() {
	m.mu.Lock()
	m.started = true
	m.mu.Unlock()
	go func() {
		defer close(m.done)
		t := time.NewTicker(m.cfg.Renew)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Renew)
				if err := m.RenewAll(ctx); err != nil {
					m.log.Error("cluster: lease renewal failed", "error", err)
				}
				cancel()
			}
		}
	}()
}

// Close stops the renewal loop (if started), waits for it, and releases
// every held lease. Call it once.
func (m *Manager) Close(ctx context.Context) error {
	close(m.stop)
	m.mu.Lock()
	started := m.started
	m.mu.Unlock()
	if started {
		<-m.done
	}
	m.mu.Lock()
	ids := make([]string, 0, len(m.held))
	for id := range m.held {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, m.Release(ctx, id))
	}
	return errors.Join(errs...)
}
