package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/pgstore"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
)

// replica is the cluster side of an agent on the shared PostgreSQL store:
// its lease manager, and the service and publisher the manager's callbacks
// reach once they exist.
type replica struct {
	id  string
	st  *pgstore.Store
	log *slog.Logger
	mgr *cluster.Manager
	svc atomic.Pointer[Service]
	pub atomic.Pointer[events.Publisher]
}

// openReplica opens the fenced PostgreSQL store of a replica and starts
// renewing its leases: sessions are claimed when created or loaded,
// dropped when their lease is lost, and released on shutdown.
func openReplica(ctx context.Context, sc ServerConfig, logger *slog.Logger) (persistence.Store, *replica, error) {
	r := &replica{id: replicaID(), log: logger}
	st, err := pgstore.Open(ctx, pgstore.Config{DSN: sc.PostgresDSN, Owner: r.id, Logger: logger})
	if err != nil {
		return nil, nil, fmt.Errorf("open postgres store: %w", err)
	}
	r.st = st
	addr := sc.Advertise
	if addr == "" {
		addr = sc.Listen
	}
	r.mgr = cluster.New(st, cluster.Config{Address: addr, TTL: sc.LeaseTTL, Logger: logger,
		OnLost: func(id string, _ error) {
			if svc := r.svc.Load(); svc != nil {
				svc.Drop(context.Background(), id)
			}
		},
		OnClaim: func(id string) {
			p := r.pub.Load()
			if p == nil {
				return
			}
			// The publisher needs the tenant for the subject: the header.
			h, err := st.ReadHeader(ctx, id)
			if errors.Is(err, persistence.ErrNotFound) {
				// A claim by Create comes before the session's row:
				// nothing stored to catch up (Created starts its cursor).
				return
			}
			if err != nil {
				logger.Warn("catch-up after a claim: reading the header failed; the session publishes on its next event", "session", id, "err", err)
				return
			}
			p.CatchUp(h)
		},
	})
	r.mgr.Start()
	logger.Info("replica on the shared PostgreSQL store", "replica", r.id, "advertise", addr)
	return cluster.NewStore(st, r.mgr), r, nil
}

// DefaultHealthPeriod is how often a replica checks its store and leases
// for its gRPC health.
const DefaultHealthPeriod = 2 * time.Second

// healthy reports why this replica should not get traffic: the database
// does not answer, or renewing its leases fails (it may be about to lose
// them all). nil means ready.
func (r *replica) healthy(ctx context.Context) error {
	return errors.Join(r.st.Ping(ctx), r.mgr.Err())
}

// sweepBatch bounds the sessions one sweep adopts.
const sweepBatch = 32

// sweep adopts, every period until ctx ends, the sessions whose lease
// expired in the middle of a turn (pgstore.Orphans): a dead replica's
// interrupted turns are closed and its sessions move here without waiting
// for a request. Replicas sweeping together race for each claim; the
// losers find the session owned elsewhere and skip it.
func (r *replica) sweep(ctx context.Context, period time.Duration) {
	every(ctx, period, func() { r.sweepOnce(ctx) })
}

// sweepOnce adopts one batch of orphaned sessions.
func (r *replica) sweepOnce(ctx context.Context) {
	svc := r.svc.Load()
	if svc == nil {
		return
	}
	ids, err := r.st.Orphans(ctx, sweepBatch)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("sweep: listing orphaned sessions failed", "err", err)
		}
		return
	}
	for _, id := range ids {
		err := svc.Adopt(ctx, id)
		var elsewhere *cluster.OwnedElsewhereError
		switch {
		case err == nil:
			r.log.Info("sweep: adopted an orphaned session (its interrupted turn is closed)", "session", id)
		case errors.As(err, &elsewhere), ctx.Err() != nil, errors.Is(err, ErrClosing): // draining
		default:
			r.log.Warn("sweep: adopting an orphaned session failed", "session", id, "err", err)
		}
	}
}

// replicaID is unique per process: host name, pid and 48 random bits.
func replicaID() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
