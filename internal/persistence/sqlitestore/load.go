package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

// Load reads a session in one read transaction, validates it (with its
// closers, see persistence.ValidateLoaded) and durably closes an
// interrupted final turn.
func (s *Store) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		h, events, err := s.read(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		closers, err := persistence.ValidateLoaded(id, events)
		if err != nil {
			return nil, nil, err
		}
		if len(closers) == 0 {
			return h, events, nil
		}
		rows, err := encodeBatch(id, closers, true)
		if err != nil {
			return nil, nil, fmt.Errorf("session %q: repair: %w", id, err)
		}
		// The repair is a write like an Append: through the committer.
		err = s.submit(ctx, id, s.appendReq(id, nil, closers, rows), nil)
		var seqErr *persistence.SeqError
		if errors.As(err, &seqErr) && attempt < 3 {
			continue // the log grew after the read: read it again
		}
		if err != nil {
			return nil, nil, fmt.Errorf("session %q: repair: %w", id, err)
		}
		return h, append(events, closers...), nil
	}
}

// read returns the header and the stored events of a session from one
// snapshot.
func (s *Store) read(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	tx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer tx.Rollback()
	var (
		hjson string
		sid   int64
	)
	err = tx.QueryRowContext(ctx, `SELECT header, sid FROM sessions WHERE id = ?`, id).Scan(&hjson, &sid)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("session %q: %w", id, err)
	}
	h, err := persistence.UnmarshalHeader(id, []byte(hjson))
	if err != nil {
		return nil, nil, err
	}
	raw, err := readRows(ctx, tx, id, sid, 0)
	if err != nil {
		return nil, nil, err
	}
	events, err := persistence.DecodeRows(id, 0, raw)
	if err != nil {
		return nil, nil, err
	}
	return h, events, nil
}

// readRows returns the stored events of session sid from seq from on,
// unframed (not decoded), checking that the batch rows are contiguous.
func readRows(ctx context.Context, tx *sql.Tx, id string, sid, from int64) ([]persistence.Row, error) {
	// From the row holding from (the last starting at or below it) on: two
	// index range scans, not a walk over the whole log.
	rows, err := tx.QueryContext(ctx, `SELECT seq, n, pb FROM batches
		WHERE sid = ?1 AND seq >= coalesce((SELECT max(seq) FROM batches WHERE sid = ?1 AND seq <= ?2), 0)
		ORDER BY seq`, sid, from)
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	defer rows.Close()
	var (
		raw  []persistence.Row
		want int64 = -1
	)
	for rows.Next() {
		var (
			seq, n int64
			pb     []byte
		)
		if err := rows.Scan(&seq, &n, &pb); err != nil {
			return nil, fmt.Errorf("session %q: %w", id, err)
		}
		if want < 0 { // the first row must hold from
			want = min(seq, from)
		}
		if raw, err = unpackRow(id, want, seq, n, pb, raw); err != nil {
			return nil, err
		}
		want = seq + n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	for len(raw) > 0 && raw[0].Seq < from {
		raw = raw[1:]
	}
	return raw, nil
}

// List returns the headers of the materialised sessions.
func (s *Store) List(ctx context.Context) ([]*sessionv1.SessionHeader, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT id, header FROM sessions ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: list: %w", err)
	}
	defer rows.Close()
	var out []*sessionv1.SessionHeader
	for rows.Next() {
		var id, hjson string
		if err := rows.Scan(&id, &hjson); err != nil {
			return nil, fmt.Errorf("sqlitestore: list: %w", err)
		}
		h, err := persistence.UnmarshalHeader(id, []byte(hjson))
		if err != nil {
			s.log.Warn("sqlitestore: skipping an unreadable session header", "session", id, "error", err)
			continue
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: list: %w", err)
	}
	return out, nil
}

// PublishedCursor returns the next seq not yet published.
func (s *Store) PublishedCursor(ctx context.Context, id string) (int64, error) {
	if err := s.checkOpen(ctx); err != nil {
		return 0, err
	}
	var next int64
	err := s.r.QueryRowContext(ctx, `SELECT coalesce((SELECT next FROM cursors WHERE cursors.sid = sessions.sid), 0)
		FROM sessions WHERE id = ?`, id).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("session %q: %w", id, err)
	}
	return next, nil
}

// SetPublishedCursor raises the published cursor.
func (s *Store) SetPublishedCursor(ctx context.Context, id string, next int64) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	// A write like an Append: raises of many sessions share a commit.
	return s.submit(ctx, "", func(g *groupTx) error { return g.raiseCursor(id, next) }, nil)
}

// SetPublishedCursors is SetPublishedCursor for many sessions in one write
// (the event publisher saves every moved cursor at once: one request of one
// group, where a call per session waited for a commit each): errs[i] is the
// result of raising ids[i]'s cursor to next[i]. A session's own failure (a
// *CursorError, ErrNotFound) leaves the others raised; a failed statement
// or commit fails them all.
func (s *Store) SetPublishedCursors(ctx context.Context, ids []string, next []int64) (errs []error) {
	errs = make([]error, len(ids))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if len(next) != len(ids) {
		return fail(fmt.Errorf("sqlitestore: %d cursors for %d sessions", len(next), len(ids)))
	}
	if len(ids) == 0 {
		return errs
	}
	if err := s.checkOpen(ctx); err != nil {
		return fail(err)
	}
	err := s.submit(ctx, "", func(g *groupTx) error {
		clear(errs) // a group re-run with savepoints runs this again
		for i, id := range ids {
			err := g.raiseCursor(id, next[i])
			var d *dirtyError
			if errors.As(err, &d) {
				return err // the whole request is undone (its savepoint, or the group's re-run)
			}
			errs[i] = err
		}
		return nil
	}, nil)
	if err != nil {
		return fail(err)
	}
	return errs
}

// raiseCursor raises session id's published cursor to next in the group's
// transaction; a cursor beyond the log is a *CursorError and a missing
// session ErrNotFound (nothing written either way).
func (g *groupTx) raiseCursor(id string, next int64) error {
	p, err := g.position(id)
	if err != nil {
		return err
	}
	if next > p.next {
		return &persistence.CursorError{SessionID: id, Next: next, Len: p.next}
	}
	if next <= 0 {
		return nil // no row is cursor 0
	}
	// Raised only if higher (a lower value is not an error).
	if _, err := g.w.exec(g.w.raiseCursor, g.w.bind(p.sid, next)); err != nil {
		return dirty(fmt.Errorf("session %q: published cursor: %w", id, err))
	}
	return nil
}

// ReadHeader returns a stored session's header.
func (s *Store) ReadHeader(ctx context.Context, id string) (*sessionv1.SessionHeader, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	var hjson string
	err := s.r.QueryRowContext(ctx, `SELECT header FROM sessions WHERE id = ?`, id).Scan(&hjson)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	return persistence.UnmarshalHeader(id, []byte(hjson))
}

// ReadEvents returns the stored events with seq >= from, without repair.
func (s *Store) ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	from = max(from, 0)
	tx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer tx.Rollback()
	sid, err := sidOf(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	raw, err := readRows(ctx, tx, id, sid, from)
	if err != nil {
		return nil, err
	}
	return persistence.DecodeRows(id, from, raw)
}

// sidOf returns a stored session's integer key.
func sidOf(ctx context.Context, tx *sql.Tx, id string) (int64, error) {
	var sid int64
	err := tx.QueryRowContext(ctx, `SELECT sid FROM sessions WHERE id = ?`, id).Scan(&sid)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("session %q: %w", id, err)
	}
	return sid, nil
}

// CheckStorage checks a stored session's storage (inspect.Verify calls it):
// the batch rows are contiguous from seq 0, each frames exactly its count of
// events, and every event's protobuf decodes to the seq its place names.
func (s *Store) CheckStorage(ctx context.Context, id string) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	tx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer tx.Rollback()
	sid, err := sidOf(ctx, tx, id)
	if err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, n, pb FROM batches WHERE sid = ? ORDER BY seq`, sid)
	if err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	defer rows.Close()
	var (
		problems []error
		want     int64
	)
	for rows.Next() {
		var (
			seq, n int64
			pb     []byte
		)
		if err := rows.Scan(&seq, &n, &pb); err != nil {
			return fmt.Errorf("session %q: %w", id, err)
		}
		evs, err := unpackRow(id, want, seq, n, pb, nil)
		if err != nil {
			problems = append(problems, err)
		}
		for _, r := range evs {
			ev := &sessionv1.SessionEvent{}
			switch err := proto.Unmarshal(r.PB, ev); {
			case err != nil:
				problems = append(problems, fmt.Errorf("seq %d: pb: %w", r.Seq, err))
			case ev.GetSeq() != r.Seq:
				problems = append(problems, fmt.Errorf("seq %d: the stored event has seq %d", r.Seq, ev.GetSeq()))
			case session.TypeName(ev) == "":
				problems = append(problems, fmt.Errorf("seq %d: event has no payload", r.Seq))
			}
		}
		want = seq + n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	return errors.Join(problems...)
}

// StoredLength returns a stored session's log length without reading its
// events.
func (s *Store) StoredLength(ctx context.Context, id string) (int64, error) {
	if err := s.checkOpen(ctx); err != nil {
		return 0, err
	}
	var next int64
	err := s.r.QueryRowContext(ctx, `SELECT `+nextSeqOf("sessions.sid")+` FROM sessions WHERE id = ?`, id).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("session %q: %w", id, err)
	}
	return next, nil
}
