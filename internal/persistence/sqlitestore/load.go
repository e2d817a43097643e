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
		data, err := encodeRows(id, closers[0].GetSeq(), closers, true)
		if err != nil {
			return nil, nil, fmt.Errorf("session %q: repair: %w", id, err)
		}
		// The repair is a write like an Append: through the committer.
		err = s.submit(ctx, func(ctx context.Context, tx *sql.Tx) error { return s.appendRows(ctx, tx, id, closers, data) }, nil)
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
		next  int64
	)
	err = tx.QueryRowContext(ctx, `SELECT header, next_seq FROM sessions WHERE id = ?`, id).Scan(&hjson, &next)
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
	rows, err := tx.QueryContext(ctx, `SELECT seq, pb FROM events WHERE session_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, nil, fmt.Errorf("session %q: %w", id, err)
	}
	defer rows.Close()
	raw := make([]persistence.Row, 0, next)
	for rows.Next() {
		var r persistence.Row
		if err := rows.Scan(&r.Seq, &r.PB); err != nil {
			return nil, nil, fmt.Errorf("session %q: %w", id, err)
		}
		raw = append(raw, r)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("session %q: %w", id, err)
	}
	if int64(len(raw)) != next {
		return nil, nil, &persistence.CorruptError{SessionID: id, Seq: int64(len(raw)), Err: fmt.Errorf("%d event rows for a log of length %d", len(raw), next)}
	}
	events, err := persistence.DecodeRows(id, 0, raw)
	if err != nil {
		return nil, nil, err
	}
	return h, events, nil
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
	err := s.r.QueryRowContext(ctx, `SELECT published_next FROM sessions WHERE id = ?`, id).Scan(&next)
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
	return s.submit(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.StmtContext(ctx, s.raiseCursor).ExecContext(ctx, id, next)
		if err != nil {
			return fmt.Errorf("session %q: published cursor: %w", id, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("session %q: published cursor: %w", id, err)
		} else if n == 1 {
			return nil
		}
		// Not raised: the session is missing, the value is not higher, or
		// it is beyond the log.
		var stored int64
		err = tx.StmtContext(ctx, s.selectNext).QueryRowContext(ctx, id).Scan(&stored)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("session %q: published cursor: %w", id, err)
		}
		if next > stored {
			return &persistence.CursorError{SessionID: id, Next: next, Len: stored}
		}
		return nil
	}, nil)
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
	var next int64
	err = tx.QueryRowContext(ctx, `SELECT next_seq FROM sessions WHERE id = ?`, id).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, pb FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq`, id, from)
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	defer rows.Close()
	raw := make([]persistence.Row, 0, max(next-from, 0))
	for rows.Next() {
		var r persistence.Row
		if err := rows.Scan(&r.Seq, &r.PB); err != nil {
			return nil, fmt.Errorf("session %q: %w", id, err)
		}
		raw = append(raw, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	return persistence.DecodeRows(id, from, raw)
}

// CheckStorage checks a stored session's storage (inspect.Verify calls it):
// next_seq equals the row count and every row's protobuf decodes to an event
// of the type its type column names.
func (s *Store) CheckStorage(ctx context.Context, id string) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	tx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer tx.Rollback()
	var next, count int64
	if err := tx.QueryRowContext(ctx, `SELECT next_seq, (SELECT count(*) FROM events WHERE session_id = ?1) FROM sessions WHERE id = ?1`, id).Scan(&next, &count); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
		}
		return fmt.Errorf("session %q: %w", id, err)
	}
	var problems []error
	if next != count {
		problems = append(problems, fmt.Errorf("next_seq %d but %d event rows", next, count))
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, type, pb FROM events WHERE session_id = ? ORDER BY seq`, id)
	if err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			seq int64
			typ string
			pb  []byte
		)
		if err := rows.Scan(&seq, &typ, &pb); err != nil {
			return fmt.Errorf("session %q: %w", id, err)
		}
		ev := &sessionv1.SessionEvent{}
		switch err := proto.Unmarshal(pb, ev); {
		case err != nil:
			problems = append(problems, fmt.Errorf("seq %d: pb: %w", seq, err))
		case session.TypeName(ev) != typ:
			problems = append(problems, fmt.Errorf("seq %d: type column %q, event is %q", seq, typ, session.TypeName(ev)))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("session %q: %w", id, err)
	}
	return errors.Join(problems...)
}

// StoredLength returns a stored session's log length (next_seq) without
// reading its events.
func (s *Store) StoredLength(ctx context.Context, id string) (int64, error) {
	if err := s.checkOpen(ctx); err != nil {
		return 0, err
	}
	var next int64
	err := s.r.QueryRowContext(ctx, `SELECT next_seq FROM sessions WHERE id = ?`, id).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("session %q: %w", id, err)
	}
	return next, nil
}
