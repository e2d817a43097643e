package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

var snapshot = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

// Load reads a session from one snapshot, validates it (with its closers,
// see persistence.ValidateLoaded) and durably closes an interrupted final
// turn (a fenced store needs the lease for that write).
func (s *Store) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		var (
			h      *sessionv1.SessionHeader
			events []*sessionv1.SessionEvent
		)
		err := pgx.BeginTxFunc(ctx, s.pool, snapshot, func(tx pgx.Tx) error {
			var (
				hjson string
				next  int64
				err   error
			)
			if hjson, next, err = sessionRow(ctx, tx, id); err != nil {
				return err
			}
			if h, err = persistence.UnmarshalHeader(id, []byte(hjson)); err != nil {
				return err
			}
			events, err = readEvents(ctx, tx, id, 0, next)
			if err == nil && int64(len(events)) != next {
				err = &persistence.CorruptError{SessionID: id, Seq: int64(len(events)), Err: fmt.Errorf("%d event rows for a log of length %d", len(events), next)}
			}
			return err
		})
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
		rows, err := encodeRows(id, closers[0].GetSeq(), closers)
		if err != nil {
			return nil, nil, fmt.Errorf("session %q: repair: %w", id, err)
		}
		err = s.appendRows(ctx, id, nil, rows)
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

// sessionRow returns a stored session's header JSON and log length.
func sessionRow(ctx context.Context, q pgx.Tx, id string) (string, int64, error) {
	var (
		hjson string
		next  int64
	)
	err := q.QueryRow(ctx, `SELECT header, next_seq FROM dsh_sessions WHERE id = $1`, id).Scan(&hjson, &next)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return "", 0, fmt.Errorf("session %q: %w", id, err)
	}
	return hjson, next, nil
}

// readEvents reads and decodes (on all CPUs) the events with seq >= from;
// every row must carry the seq due at its position.
func readEvents(ctx context.Context, tx pgx.Tx, id string, from, next int64) ([]*sessionv1.SessionEvent, error) {
	rows, err := tx.Query(ctx, `SELECT seq, pb FROM dsh_events WHERE session_id = $1 AND seq >= $2 ORDER BY seq`, id, from)
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	all := make([]persistence.Row, 0, max(next-from, 0))
	var r persistence.Row
	_, err = pgx.ForEachRow(rows, []any{&r.Seq, &r.PB}, func() error {
		all = append(all, r)
		r.PB = nil
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", id, err)
	}
	return persistence.DecodeRows(id, from, all)
}

// List returns the headers of the materialised sessions.
func (s *Store) List(ctx context.Context) ([]*sessionv1.SessionHeader, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT id, header FROM dsh_sessions ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	var (
		out       []*sessionv1.SessionHeader
		id, hjson string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &hjson}, func() error {
		h, err := persistence.UnmarshalHeader(id, []byte(hjson))
		if err != nil {
			s.log.Warn("pgstore: skipping an unreadable session header", "session", id, "error", err)
			return nil
		}
		out = append(out, h)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	return out, nil
}

// PublishedCursor returns the next seq not yet published.
func (s *Store) PublishedCursor(ctx context.Context, id string) (int64, error) {
	if err := s.checkOpen(ctx); err != nil {
		return 0, err
	}
	var next int64
	err := s.pool.QueryRow(ctx, `SELECT published_next FROM dsh_sessions WHERE id = $1`, id).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("session %q: %w", id, err)
	}
	return next, nil
}

// SetPublishedCursor raises the published cursor, never beyond the durable
// log (*persistence.CursorError).
func (s *Store) SetPublishedCursor(ctx context.Context, id string, next int64) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	// One statement: raise when higher and within the log, and report the
	// stored length either way.
	var stored int64
	err := s.pool.QueryRow(ctx, `
		WITH raised AS (
			UPDATE dsh_sessions SET published_next = $2
			WHERE id = $1 AND published_next < $2 AND $2 <= next_seq
			RETURNING next_seq)
		SELECT next_seq FROM raised
		UNION ALL SELECT next_seq FROM dsh_sessions WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM raised)`, id, next).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("session %q: published cursor: %w", id, err)
	}
	if next > stored {
		return &persistence.CursorError{SessionID: id, Next: next, Len: stored}
	}
	return nil
}

// ReadHeader returns a stored session's header.
func (s *Store) ReadHeader(ctx context.Context, id string) (*sessionv1.SessionHeader, error) {
	if err := s.checkOpen(ctx); err != nil {
		return nil, err
	}
	var hjson string
	err := s.pool.QueryRow(ctx, `SELECT header FROM dsh_sessions WHERE id = $1`, id).Scan(&hjson)
	if errors.Is(err, pgx.ErrNoRows) {
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
	var events []*sessionv1.SessionEvent
	err := pgx.BeginTxFunc(ctx, s.pool, snapshot, func(tx pgx.Tx) error {
		_, next, err := sessionRow(ctx, tx, id)
		if err != nil {
			return err
		}
		events, err = readEvents(ctx, tx, id, from, next)
		return err
	})
	return events, err
}

// CheckStorage checks a stored session's rows (inspect.Verify calls it):
// next_seq equals the row count, the cursor is within the log, and every
// row's seq and type columns match its event.
func (s *Store) CheckStorage(ctx context.Context, id string) error {
	if err := s.checkOpen(ctx); err != nil {
		return err
	}
	var problems []error
	err := pgx.BeginTxFunc(ctx, s.pool, snapshot, func(tx pgx.Tx) error {
		var next, published, count int64
		err := tx.QueryRow(ctx, `SELECT next_seq, published_next, (SELECT count(*) FROM dsh_events WHERE session_id = $1) FROM dsh_sessions WHERE id = $1`, id).
			Scan(&next, &published, &count)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("session %q: %w", id, err)
		}
		if next != count {
			problems = append(problems, fmt.Errorf("next_seq %d but %d event rows", next, count))
		}
		if published > next {
			problems = append(problems, fmt.Errorf("published cursor %d beyond next_seq %d", published, next))
		}
		rows, err := tx.Query(ctx, `SELECT seq, type, pb FROM dsh_events WHERE session_id = $1 ORDER BY seq`, id)
		if err != nil {
			return fmt.Errorf("session %q: %w", id, err)
		}
		var (
			seq int64
			typ string
			pb  []byte
		)
		_, err = pgx.ForEachRow(rows, []any{&seq, &typ, &pb}, func() error {
			ev := &sessionv1.SessionEvent{}
			switch err := proto.Unmarshal(pb, ev); {
			case err != nil:
				problems = append(problems, fmt.Errorf("seq %d: pb: %w", seq, err))
			case ev.GetSeq() != seq:
				problems = append(problems, fmt.Errorf("seq %d: event carries seq %d", seq, ev.GetSeq()))
			case session.TypeName(ev) != typ:
				problems = append(problems, fmt.Errorf("seq %d: type column %q, event is %q", seq, typ, session.TypeName(ev)))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("session %q: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return errors.Join(problems...)
}
