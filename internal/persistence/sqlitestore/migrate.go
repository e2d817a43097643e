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
// transaction of migrate, so a crash leaves version 1 intact.
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
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion)); err != nil {
		return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: migrate to version 2: %w", err)
	}
	s.log.Info("sqlitestore: migrated to schema version 2 (one encoding per event)")
	return nil
}
