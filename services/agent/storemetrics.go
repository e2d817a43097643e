package agent

import (
	"context"
	"sync/atomic"

	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// openSQLite opens the SQLite store with its group-commit metrics (batch
// size, commit and write latency, queue depth) on the global meter
// provider, which records them only when metrics are exported (OTLP or
// --debug-addr).
func openSQLite(ctx context.Context, cfg sqlitestore.Config) (*sqlitestore.Store, error) {
	var m atomic.Pointer[telemetry.StoreMetrics]
	cfg.OnCommit = func(c sqlitestore.CommitStats) {
		m.Load().RecordCommit(context.Background(), c.Requests, c.Duration, c.Waits)
	}
	st, err := sqlitestore.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if sm, err := telemetry.NewStoreMetrics(nil, func() int64 { return int64(st.QueueDepth()) }); err == nil {
		m.Store(sm)
	}
	return st, nil
}
