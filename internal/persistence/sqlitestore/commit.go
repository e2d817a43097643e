package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// Group commit.
//
// Every write (an Append, a published-cursor raise) is a request handed to
// the store's committer goroutine, which owns the writer connection. The
// committer takes every request already waiting (up to maxGroup), runs them
// in one IMMEDIATE transaction — a request that fails fails alone and the
// others still commit (see commitGroup: savepoints only when needed) — and commits
// once: one WAL fsync for the whole group under synchronous=FULL. Each
// request learns its own result only after that commit, so an Append still
// returns nil only once its batch is durable. A request never waits for a
// group to fill: while one group commits, the next requests queue, and
// they form the next group (the batch grows with the load, and a lone
// request commits at once).

// maxGroup bounds the requests of one transaction (and so the time a
// request can wait behind others of its group).
const maxGroup = 512

// writeReq is one write waiting for the committer.
type writeReq struct {
	ctx    context.Context
	queued time.Time
	// run does the request's statements in tx; a nil result keeps them,
	// else they are undone (by re-running the group with a savepoint per
	// request when a statement had already written).
	run  func(ctx context.Context, tx *sql.Tx) error
	done chan error // buffered 1: the result after the group's commit
	// after runs on the committer once the group committed (nil result).
	after func()
}

// CommitStats describes one committed group, for metrics.
type CommitStats struct {
	Requests int           // writes in the transaction
	Duration time.Duration // begin to commit, fsync included
	// Waits holds, per committed write, the time from its submission to
	// the commit (its flush latency); valid only during the OnCommit call.
	Waits []time.Duration
}

// QueueDepth is the number of writes waiting for the committer.
func (s *Store) QueueDepth() int { return len(s.queue) }

// submit hands fn to the committer and waits for its durable result. Once
// queued, the request is waited for regardless of ctx (the committer skips
// it if ctx ended before it ran), so an error always means nothing of it
// was stored.
func (s *Store) submit(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error, after func()) error {
	r := &writeReq{ctx: ctx, queued: time.Now(), run: fn, done: make(chan error, 1), after: after}
	s.gate.RLock()
	if s.gateShut {
		s.gate.RUnlock()
		return persistence.ErrClosed
	}
	select {
	case s.queue <- r: // the committer runs until Close has the gate
	case <-ctx.Done():
		s.gate.RUnlock()
		return ctx.Err()
	}
	s.gate.RUnlock()
	return <-r.done
}

// committer runs until stop closes and the queue is drained.
func (s *Store) committer() {
	defer close(s.stopped)
	group := make([]*writeReq, 0, maxGroup)
	for {
		var first *writeReq
		select {
		case first = <-s.queue:
		case <-s.stop:
			// Close holds the gate: nothing more queues. Commit the rest.
			select {
			case first = <-s.queue:
			default:
				return
			}
		}
		group = append(group[:0], first)
	fill:
		for len(group) < maxGroup {
			select {
			case r := <-s.queue:
				group = append(group, r)
			default:
				break fill
			}
		}
		s.commitGroup(group)
	}
}

// commitGroup runs group in one transaction and answers every request.
//
// The requests run without savepoints first: a request that fails with
// one of its own checks (a wrong seq, a missing session) wrote nothing,
// so the others can commit. Only when one failed in a statement (a
// *dirtyError: it may have written part of its rows, or SQLite may have
// rolled the transaction back) is the transaction rolled back and the
// group run again with a SAVEPOINT per request, so that it fails alone.
// (A savepoint per request costs two statements and a sub-journal copy
// of each page the request touches.)
func (s *Store) commitGroup(group []*writeReq) {
	start := time.Now()
	results := make([]error, len(group))
	ran, err := s.runGroup(group, results, false)
	var dirty *dirtyError
	if errors.As(err, &dirty) {
		clear(results)
		ran, err = s.runGroup(group, results, true)
	}
	if err != nil {
		s.answer(group, nil, err)
		return
	}
	if ran > 0 && s.onCommit != nil {
		now := time.Now()
		waits := s.waits[:0]
		for i, r := range group {
			if results[i] == nil {
				waits = append(waits, now.Sub(r.queued))
			}
		}
		s.waits = waits
		s.onCommit(CommitStats{Requests: ran, Duration: now.Sub(start), Waits: waits})
	}
	s.answer(group, results, nil)
}

// dirtyError is the error of a request that failed in a statement: it may
// have written, so only a rollback (of its savepoint) undoes it.
type dirtyError struct{ err error }

func (e *dirtyError) Error() string { return e.err.Error() }
func (e *dirtyError) Unwrap() error { return e.err }

// dirty marks err (from a statement) as a *dirtyError.
func dirty(err error) error { return &dirtyError{err} }

// runGroup runs group in one transaction, results[i] getting request i's
// own error, and commits if any request succeeded; it returns the number
// that did. Without savepoints, a *dirtyError of a request is returned
// (after rolling back) for the caller to run the group again with them;
// any other error means nothing was committed.
func (s *Store) runGroup(group []*writeReq, results []error, savepoints bool) (int, error) {
	ctx := context.Background() // each request checks its own ctx
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: begin: %w", err)
	}
	ran := 0
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if !savepoints {
			err := r.run(r.ctx, tx)
			var d *dirtyError
			if errors.As(err, &d) {
				s.rollback(tx)
				return 0, err
			}
			if results[i] = err; err == nil {
				ran++
			}
			continue
		}
		if _, err := tx.ExecContext(ctx, "SAVEPOINT w"); err != nil {
			results[i] = fmt.Errorf("sqlitestore: savepoint: %w", err)
			continue
		}
		if err := r.run(r.ctx, tx); err != nil {
			var d *dirtyError
			if errors.As(err, &d) {
				err = d.err
			}
			results[i] = err
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO w"); rerr != nil {
				// The transaction is in an unknown state: fail the group.
				s.rollback(tx)
				return 0, fmt.Errorf("sqlitestore: rollback to savepoint: %w", rerr)
			}
		} else {
			ran++
		}
		if _, err := tx.ExecContext(ctx, "RELEASE w"); err != nil {
			s.rollback(tx)
			return 0, fmt.Errorf("sqlitestore: release savepoint: %w", err)
		}
	}
	if ran == 0 {
		s.rollback(tx)
		return 0, nil
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlitestore: commit: %w", err)
	}
	return ran, nil
}

func (s *Store) rollback(tx *sql.Tx) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		s.log.Error("sqlitestore: rollback failed", "error", err)
	}
}

// answer sends each request its result: all the same err when err is
// non-nil (nothing committed), else results[i]; a request that succeeded
// runs its after hook first.
func (s *Store) answer(group []*writeReq, results []error, err error) {
	for i, r := range group {
		res := err
		if err == nil {
			res = results[i]
		}
		if res == nil && r.after != nil {
			r.after()
		}
		r.done <- res
	}
}

// appendReq is the statement sequence of one Append: materialise a pending
// session (h non-nil) or look the session up, check the stored next seq and
// insert the rows. Its checks come before its first write, so a request
// that fails one of them wrote nothing; a failed statement is a
// *dirtyError.
func (s *Store) appendReq(id string, h *sessionv1.SessionHeader, events []*sessionv1.SessionEvent, rows []batchRow) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		var sid int64
		if h != nil {
			if err := persistence.CheckBatch(id, 0, events); err != nil {
				return err
			}
			var err error
			if sid, err = s.materialize(ctx, tx, h); err != nil {
				return err
			}
		} else {
			var (
				next int64
				err  error
			)
			if sid, next, err = s.lookup(ctx, tx, id); err != nil {
				return err
			}
			if err := persistence.CheckBatch(id, next, events); err != nil {
				return err
			}
		}
		return s.insertRows(ctx, tx, id, sid, rows)
	}
}
