package agent

import "time"

// DefaultDrainTimeout is the shutdown budget when none is configured: it fits
// Kubernetes' default terminationGracePeriodSeconds (30 s) with 5 s to spare
// for the gRPC server's stop, the NATS flush and the process exit.
const DefaultDrainTimeout = 25 * time.Second

// DrainReserve is the part of a drain budget kept for disposing the turns
// that did not finish and the final flushes: a fifth of it, at most 5 s.
// Running turns get the rest.
func DrainReserve(budget time.Duration) time.Duration {
	return min(budget/5, 5*time.Second)
}
