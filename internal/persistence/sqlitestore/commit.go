package sqlitestore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
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
// returns nil only once its batch is durable. While one group
// commits, the next requests queue, and they form the next group: the
// batch grows with the load, and a lone request commits at once.
//
// Commit delay (Config.CommitDelay, as PostgreSQL's commit_delay with its
// commit_siblings). When at least two sessions appended in the last window
// (rateWindow) and appends arrive fast enough that at least
// minDelayedAppends more are expected within the delay, the committer holds
// the group open for up to the delay before it commits, or until it holds
// an append of as many sessions as were appending in that window (two
// sessions writing in turn are committed as soon as both are in, not after
// the whole delay; with hundreds the delay ends it). The groups are then
// larger, and fewer commits cost fewer syscalls and fsyncs; the sessions whose writes
// shared a commit also resume together, so their next model requests and
// tool calls go out in the same moment and the gRPC connections, the event
// fan-out and the other services batch them as well. A lone session is not
// held (a published-cursor raise is not an append), nor are a few sessions
// appending seldom; a lone session is held only during the window after
// one in which another session appended (a load's repair, a new session),
// at most the delay per write. The durability rule is unchanged: an Append
// returns once its group is durable.

// minDelayedAppends is how many more appends the committer must expect
// within the commit delay before it holds a group open; rateWindow is how
// long the appends and the appending sessions are counted over (a window
// closes at the first group after it is over).
const (
	minDelayedAppends = 2
	rateWindow        = 20 * time.Millisecond
)

// arrivals estimates the rate at which appends reach the committer and how
// many sessions are appending. Cursor raises are not counted: a hold does
// not wait for them.
type arrivals struct {
	start    time.Time           // when the current window began
	n        int                 // appends counted since start
	sessions map[string]struct{} // the sessions that appended since start
	rate     float64             // appends per second over the last window that ended
	siblings int                 // the sessions that appended in it
}

// want reports how many appends the group whose first write arrives now
// should gather before its commit, or 0 not to hold it: as many as the
// sessions that were appending, and 0 unless two were and at least
// minDelayedAppends more appends are expected within d. (Stopping at the
// appends the rate predicts made holds shorter and took two thirds of the
// gain away: the waves of sessions resuming together are most of it.) A
// window that ended is closed first, so a rate from before an idle spell
// does not outlive it.
func (a *arrivals) want(now time.Time, d time.Duration) int {
	if el := now.Sub(a.start); el >= rateWindow {
		a.rate = float64(a.n) / el.Seconds()
		a.siblings = len(a.sessions)
		clear(a.sessions)
		a.start, a.n = now, 0
	}
	expected := a.rate * d.Seconds()
	if a.siblings < 2 || expected < minDelayedAppends {
		return 0
	}
	return a.siblings
}

// add counts the appends of a group taken for its commit.
func (a *arrivals) add(group []*writeReq) {
	for _, r := range group {
		if r.session != "" {
			a.n++
			if a.sessions == nil {
				a.sessions = make(map[string]struct{})
			}
			a.sessions[r.session] = struct{}{}
		}
	}
}

// maxGroup bounds the requests of one transaction (and so the time a
// request can wait behind others of its group).
const maxGroup = 512

// writeReq is one write waiting for the committer.
type writeReq struct {
	ctx    context.Context
	queued time.Time
	// run does the request's work in the group's transaction; a nil result
	// keeps it, else it is undone (by re-running the group with a
	// savepoint per request when a statement had already written).
	run  func(g *groupTx) error
	done chan error // buffered 1: the result after the group's commit
	// session is the appending session's id ("" for a cursor raise): the
	// commit delay counts the sessions writing at once by it.
	session string
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
func (s *Store) submit(ctx context.Context, session string, fn func(g *groupTx) error, after func()) error {
	r := &writeReq{ctx: ctx, queued: time.Now(), run: fn, done: make(chan error, 1), after: after, session: session}
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
		if s.commitDelay > 0 {
			if want := s.arrivals.want(time.Now(), s.commitDelay); want > 0 {
				group = s.gather(group, want, s.commitDelay)
			}
		}
	fill:
		for len(group) < maxGroup {
			select {
			case r := <-s.queue:
				group = append(group, r)
			default:
				break fill
			}
		}
		if s.commitDelay > 0 {
			s.arrivals.add(group)
		}
		s.commitGroup(group)
		// No request, result or row outlives its answer here (a savepoint
		// re-run leaves the first pass's rows beyond len, the last INSERT's
		// arguments hold its rows' bytes).
		clear(group)
		clear(s.results)
		clear(s.group.rows[:cap(s.group.rows)])
		clear(s.w.args[:cap(s.w.args)])
	}
}

// gather holds group open for up to d, taking the writes that queue, until
// it holds want appends (or maxGroup writes); Close ends it at once (the
// group is then committed as it is).
func (s *Store) gather(group []*writeReq, want int, d time.Duration) []*writeReq {
	have := 0
	for _, r := range group {
		if r.session != "" {
			have++
		}
	}
	if have >= want {
		return group
	}
	if s.holdHook != nil {
		s.holdHook()
	}
	if s.holdTimer == nil {
		s.holdTimer = time.NewTimer(d)
	} else {
		s.holdTimer.Reset(d)
	}
	defer s.holdTimer.Stop()
	for have < want && len(group) < maxGroup {
		select {
		case r := <-s.queue:
			group = append(group, r)
			if r.session != "" {
				have++
			}
		case <-s.holdTimer.C:
			return group
		case <-s.closing:
			return group
		}
	}
	return group
}

// commitGroup runs group in one transaction and answers every request.
//
// The requests run without savepoints first: a request that fails with
// one of its own checks (a wrong seq, a missing session) wrote nothing,
// so the others can commit. Only when a statement failed (a *dirtyError:
// it may have written part of its rows, or SQLite may have rolled the
// transaction back) is the transaction rolled back and the group run
// again with a SAVEPOINT per request, so that it fails alone. (A
// savepoint per request costs two statements and a sub-journal copy of
// each page the request touches.)
func (s *Store) commitGroup(group []*writeReq) {
	start := time.Now()
	results := s.results[:0]
	for range group {
		results = append(results, nil)
	}
	s.results = results
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

// position is where a stored session's log ends: its sid and next seq.
type position struct{ sid, next int64 }

// maxPositions bounds the committer's cache of positions (a miss costs one
// index lookup; the cache starts over when full).
const maxPositions = 1 << 16

// groupTx is one group's transaction as its requests see it.
//
// Without savepoints (the common path) a request does not write its batch
// rows itself: it queues them (insert), and runGroup inserts the rows of
// every request of the group with a few multi-row INSERTs before the
// commit; where a session's log ends is taken from the committer's cache
// of positions (Store.positions, kept from earlier commits of this
// connection) or looked up once, and staged for the rest of the group. With
// savepoints every request inserts its own rows and looks its session up
// in the database, so that rolling back its savepoint undoes all of it.
type groupTx struct {
	s          *Store
	w          *writer
	savepoints bool
	staged     map[string]position // positions as of this transaction (without savepoints)
	rows       []queuedRow         // rows to insert before the commit (without savepoints)
}

// queuedRow is a batch row of a request waiting for the group's INSERT.
type queuedRow struct {
	sid int64
	row batchRow
}

// position returns where session id's log ends in this transaction; a
// missing session is ErrNotFound (nothing written).
func (g *groupTx) position(id string) (position, error) {
	if !g.savepoints {
		if p, ok := g.staged[id]; ok {
			return p, nil
		}
		if p, ok := g.s.positions[id]; ok {
			g.staged[id] = p
			return p, nil
		}
	}
	v, ok, err := g.w.queryRow(g.w.lookupSession, g.w.bind(id))
	if err != nil {
		return position{}, dirty(fmt.Errorf("session %q: %w", id, err))
	}
	if !ok {
		return position{}, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	p := position{sid: v[0], next: v[1]}
	if !g.savepoints {
		g.staged[id] = p
	}
	return p, nil
}

// insert stores a checked batch's rows as the end of session id's log (a
// failure is a *dirtyError: earlier rows, or the materialised session, may
// be written). Without savepoints the rows are queued for the group's
// INSERT and the new end staged.
func (g *groupTx) insert(id string, p position, rows []batchRow) error {
	if !g.savepoints {
		for _, r := range rows {
			g.rows = append(g.rows, queuedRow{p.sid, r})
		}
		last := rows[len(rows)-1]
		g.staged[id] = position{sid: p.sid, next: last.seq + int64(last.n)}
		return nil
	}
	for _, r := range rows {
		if _, err := g.w.exec(g.w.insertBatch, g.w.bind(p.sid, r.seq, int64(r.n), r.pb)); err != nil {
			return dirty(fmt.Errorf("session %q: insert seqs %d..%d: %w", id, r.seq, r.seq+int64(r.n)-1, err))
		}
	}
	return nil
}

// insertQueued inserts the queued rows, up to maxInsertRows per statement.
func (g *groupTx) insertQueued() error {
	for rows := g.rows; len(rows) > 0; {
		k := min(len(rows), maxInsertRows)
		st, err := g.w.insertStmt(k)
		if err != nil {
			return dirty(err)
		}
		args := g.w.args[:0]
		for i, q := range rows[:k] {
			args = append(args,
				driver.NamedValue{Ordinal: 4*i + 1, Value: q.sid},
				driver.NamedValue{Ordinal: 4*i + 2, Value: q.row.seq},
				driver.NamedValue{Ordinal: 4*i + 3, Value: int64(q.row.n)},
				driver.NamedValue{Ordinal: 4*i + 4, Value: q.row.pb})
		}
		g.w.args = args
		if _, err := g.w.exec(st, args); err != nil {
			return dirty(fmt.Errorf("sqlitestore: insert %d batch rows: %w", k, err))
		}
		rows = rows[k:]
	}
	return nil
}

// runGroup runs group in one transaction, results[i] getting request i's
// own error, and commits if any request succeeded; it returns the number
// that did. Without savepoints, a *dirtyError of a request is returned
// (after rolling back) for the caller to run the group again with them;
// any other error means nothing was committed.
func (s *Store) runGroup(group []*writeReq, results []error, savepoints bool) (int, error) {
	w := s.w
	if err := w.exec0(w.begin); err != nil {
		// A transaction left open by a ROLLBACK that failed earlier would
		// fail every later BEGIN: end it (no transaction is not an error).
		s.rollback()
		return 0, fmt.Errorf("sqlitestore: begin: %w", err)
	}
	// Another connection (another process on the same file) may have
	// written since this one last committed: then the cached positions may
	// be stale. data_version changes exactly then.
	v, _, err := w.queryRow(w.dataVersion, nil)
	if err != nil {
		s.rollback()
		return 0, fmt.Errorf("sqlitestore: data version: %w", err)
	}
	if v[0] != s.dataVersion {
		s.forgetPositions()
		s.dataVersion = v[0]
	}
	g := &s.group
	*g = groupTx{s: s, w: w, savepoints: savepoints, staged: g.staged, rows: g.rows[:0]}
	clear(g.staged)
	ran := 0
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if !savepoints {
			err := r.run(g)
			var d *dirtyError
			if errors.As(err, &d) {
				s.rollback()
				return 0, err
			}
			if results[i] = err; err == nil {
				ran++
			}
			continue
		}
		if err := w.exec0(w.savepoint); err != nil {
			// As for RELEASE: the transaction's state is unknown (a later
			// SAVEPOINT outside it would start a new one), fail the group.
			s.rollback()
			return 0, fmt.Errorf("sqlitestore: savepoint: %w", err)
		}
		if err := r.run(g); err != nil {
			var d *dirtyError
			if errors.As(err, &d) {
				err = d.err
			}
			results[i] = err
			if rerr := w.exec0(w.rollbackTo); rerr != nil {
				// The transaction is in an unknown state: fail the group.
				s.rollback()
				return 0, fmt.Errorf("sqlitestore: rollback to savepoint: %w", rerr)
			}
		} else {
			ran++
		}
		if err := w.exec0(w.releaseSavept); err != nil {
			s.rollback()
			return 0, fmt.Errorf("sqlitestore: release savepoint: %w", err)
		}
	}
	if ran == 0 {
		// Nothing was written: a request that failed one of its own checks
		// wrote nothing, and with savepoints each was rolled back to its
		// own. The cached positions still hold (another writer would
		// change data_version), and so do the ones this group looked up:
		// a group of refused or cancelled requests no longer costs the
		// next group a lookup per session.
		if err := s.w.rollback(); err != nil {
			s.log.Error("sqlitestore: rollback failed", "error", err)
			s.forgetPositions()
			return 0, nil
		}
		if !savepoints {
			s.keepPositions(g.staged)
		}
		return 0, nil
	}
	if err := g.insertQueued(); err != nil {
		s.rollback()
		return 0, err // dirty: run again with savepoints, each request inserting its own rows
	}
	if err := w.exec0(w.commit); err != nil {
		s.rollback() // a COMMIT that failed may leave the transaction open
		return 0, fmt.Errorf("sqlitestore: commit: %w", err)
	}
	if savepoints {
		// Requests looked their sessions up in the database; positions
		// cached from before may have moved.
		s.forgetPositions()
		return ran, nil
	}
	s.keepPositions(g.staged)
	return ran, nil
}

// keepPositions adds a transaction's positions to the cache (emptied first
// when they would not fit).
func (s *Store) keepPositions(staged map[string]position) {
	if len(s.positions)+len(staged) > maxPositions {
		s.forgetPositions()
	}
	maps.Copy(s.positions, staged)
}

// forgetPositions empties the committer's cache of positions (after a
// failed transaction, a write by another connection, or when full; not
// after a transaction where every request failed its own checks).
func (s *Store) forgetPositions() { clear(s.positions) }

// rollback rolls the committer's transaction back; what it staged is
// dropped with it.
func (s *Store) rollback() {
	s.forgetPositions()
	if err := s.w.rollback(); err != nil {
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

// appendReq is the work of one Append: materialise a pending session (h
// non-nil) or find where the session's log ends, check the batch starts
// there and insert its rows. Its checks come before its first write, so a
// request that fails one of them wrote nothing; a failed statement is a
// *dirtyError.
func (s *Store) appendReq(id string, h *sessionv1.SessionHeader, events []*sessionv1.SessionEvent, rows []batchRow) func(*groupTx) error {
	return func(g *groupTx) error {
		var p position
		if h != nil {
			if err := persistence.CheckBatch(id, 0, events); err != nil {
				return err
			}
			sid, err := g.materialize(h)
			if err != nil {
				return err
			}
			p = position{sid: sid}
		} else {
			var err error
			if p, err = g.position(id); err != nil {
				return err
			}
			if err := persistence.CheckBatch(id, p.next, events); err != nil {
				return err
			}
		}
		return g.insert(id, p, rows)
	}
}
