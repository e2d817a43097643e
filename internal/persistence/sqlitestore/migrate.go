package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// migrate1to2 turns a version-1 database (each event stored twice: JSON in
// events.data and protobuf in events.pb) into version 2 (pb only), in the
// transaction of migrate (which goes on to version 4), so a crash leaves
// version 1 intact.
//
// Nothing accepted is lost: before the JSON copy goes, every row's pb must
// decode; a row whose pb does not but whose JSON does gets its pb rebuilt
// from the JSON, and a row where neither decodes stops the migration (the
// database stays at version 1 and Open fails naming the row).
func (s *Store) migrate1to2(ctx context.Context, tx *sql.Tx) error {
	type fix struct {
		id  string
		seq int64
		pb  []byte
	}
	var fixes []fix
	rows, err := tx.QueryContext(ctx, `SELECT session_id, seq, data, pb FROM events`)
	if err != nil {
		return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
	}
	for rows.Next() {
		var (
			id, js string
			seq    int64
			pb     []byte
		)
		if err := rows.Scan(&id, &seq, &js, &pb); err != nil {
			rows.Close()
			return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
		}
		if proto.Unmarshal(pb, &sessionv1.SessionEvent{}) == nil {
			continue
		}
		ev, jerr := persistence.DecodeEvent([]byte(js))
		if jerr != nil {
			rows.Close()
			return fmt.Errorf("sqlitestore: migrate to version 2 (the database stays at version 1): %w",
				&persistence.CorruptError{SessionID: id, Seq: seq, Err: fmt.Errorf("neither the protobuf nor the JSON copy decodes: %w", jerr)})
		}
		b, err := pbMarshal.Marshal(ev)
		if err != nil {
			rows.Close()
			return fmt.Errorf("sqlitestore: migrate to version 2: session %q seq %d: %w", id, seq, err)
		}
		fixes = append(fixes, fix{id, seq, b})
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
	}
	for _, f := range fixes {
		if _, err := tx.ExecContext(ctx, `UPDATE events SET pb = ? WHERE session_id = ? AND seq = ?`, f.pb, f.id, f.seq); err != nil {
			return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
		}
	}
	if len(fixes) > 0 {
		s.log.Warn("sqlitestore: migration rebuilt event protobufs from their JSON copies", "rows", len(fixes))
	}
	if _, err := tx.ExecContext(ctx, `ALTER TABLE events DROP COLUMN data`); err != nil {
		return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
	}
	return nil
}

// migrate2to3 turns a version-2 database (one events row per event, keyed
// by the text session id; a next_seq column updated on every append) into
// version 3 (one batches row per run of events, keyed by an integer sid;
// the log length derived), in the transaction of migrate. from is the
// version the database had, for messages.
//
// Nothing accepted is lost, and the copy is checked: each session's rows
// must be seqs 0 .. next_seq-1 exactly, copied byte for byte; a session
// whose rows are not (a gap, a row beyond its length) stops the migration
// (the database stays at its version and Open fails naming the session and
// seq), and so does a total that differs after the copy.
func (s *Store) migrate2to3(ctx context.Context, tx *sql.Tx, from int) error {
	fail := func(err error) error {
		return fmt.Errorf("sqlitestore: migrate to version 3 (the database stays at version %d): %w", from, err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE sessions_v3 `+sessionsColumnsV3+batchesTable); err != nil {
		return fail(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sessions_v3 (id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header, published_next)
		SELECT id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header, published_next FROM sessions ORDER BY created_at, id`); err != nil {
		return fail(err)
	}
	type sess struct {
		sid, next int64
		id        string
	}
	var all []sess
	rows, err := tx.QueryContext(ctx, `SELECT n.sid, n.id, o.next_seq FROM sessions_v3 n JOIN sessions o ON o.id = n.id ORDER BY n.sid`)
	if err != nil {
		return fail(err)
	}
	for rows.Next() {
		var x sess
		if err := rows.Scan(&x.sid, &x.id, &x.next); err != nil {
			rows.Close()
			return fail(err)
		}
		all = append(all, x)
	}
	if err := rows.Close(); err != nil {
		return fail(err)
	}
	insert, err := tx.PrepareContext(ctx, insertBatchSQL)
	if err != nil {
		return fail(err)
	}
	defer insert.Close()
	var copied int64
	for _, x := range all {
		data, err := v2Events(ctx, tx, x.id, x.next)
		if err != nil {
			return fail(err)
		}
		for _, r := range packRows(0, data) {
			if _, err := insert.ExecContext(ctx, x.sid, r.seq, r.n, r.pb); err != nil {
				return fail(err)
			}
		}
		copied += int64(len(data))
	}
	var before, after int64
	if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM events), (SELECT coalesce(sum(n), 0) FROM batches)`).Scan(&before, &after); err != nil {
		return fail(err)
	}
	if before != copied || after != copied {
		return fail(fmt.Errorf("%d event rows, %d copied, %d stored", before, copied, after))
	}
	for _, q := range []string{
		`DROP TABLE events`,
		`DROP TABLE sessions`,
		`ALTER TABLE sessions_v3 RENAME TO sessions`,
		`CREATE INDEX sessions_by_created ON sessions (created_at, id)`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fail(err)
		}
	}
	return nil
}

// v2Events returns the protobufs of a version-2 session's events in seq
// order, checking that they are exactly seqs 0 .. next-1.
func v2Events(ctx context.Context, tx *sql.Tx, id string, next int64) ([][]byte, error) {
	rows, err := tx.QueryContext(ctx, `SELECT seq, pb FROM events WHERE session_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	data := make([][]byte, 0, next)
	for rows.Next() {
		var (
			seq int64
			pb  []byte
		)
		if err := rows.Scan(&seq, &pb); err != nil {
			return nil, err
		}
		if want := int64(len(data)); seq != want || want >= next {
			return nil, &persistence.CorruptError{SessionID: id, Seq: want, Err: fmt.Errorf("row at seq %d in a log of length %d", seq, next)}
		}
		data = append(data, pb)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if int64(len(data)) != next {
		return nil, &persistence.CorruptError{SessionID: id, Seq: int64(len(data)), Err: fmt.Errorf("%d event rows for a log of length %d", len(data), next)}
	}
	return data, nil
}

// migrate3to4 moves the published cursors out of the version-3 sessions
// rows (the published_next column) into the cursors table, in the
// transaction of migrate; from is the version the database had, for
// messages. Only a cursor that was raised gets a row (no row means 0), and
// the copy is checked: every raised cursor must be in cursors with its
// value before the column goes.
func (s *Store) migrate3to4(ctx context.Context, tx *sql.Tx, from int) error {
	fail := func(err error) error {
		return fmt.Errorf("sqlitestore: migrate to version 4 (the database stays at version %d): %w", from, err)
	}
	for _, q := range []string{
		cursorsTable,
		`INSERT INTO cursors (sid, next) SELECT sid, published_next FROM sessions WHERE published_next > 0`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fail(err)
		}
	}
	var raised, copied int64
	if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sessions WHERE published_next > 0),
		(SELECT count(*) FROM cursors c JOIN sessions s ON s.sid = c.sid AND s.published_next = c.next)`).Scan(&raised, &copied); err != nil {
		return fail(err)
	}
	if raised != copied {
		return fail(fmt.Errorf("%d raised cursors, %d copied", raised, copied))
	}
	if _, err := tx.ExecContext(ctx, `ALTER TABLE sessions DROP COLUMN published_next`); err != nil {
		return fail(err)
	}
	return nil
}
