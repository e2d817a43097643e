package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dsh-dev/dsh/internal/persistence"
)

// migrations[i] brings the schema from version i to version i+1. They are
// applied at Open, in one transaction, under an advisory lock so that
// replicas starting together migrate once. Append only: a released
// migration is never edited.
var migrations = []string{
	// 1: sessions, events (one protobuf encoding per event), leases, and a
	// view for people.
	`
CREATE TABLE dsh_sessions (
	id               text PRIMARY KEY,
	version          integer NOT NULL,
	created_at       bigint NOT NULL,
	cwd              text NOT NULL,
	parent_session   text NOT NULL,
	seed_length      bigint,
	delegation_depth integer NOT NULL,
	header           text NOT NULL,             -- the full header as protojson
	next_seq         bigint NOT NULL,           -- stored log length
	published_next   bigint NOT NULL DEFAULT 0, -- next seq not yet published
	CHECK (published_next <= next_seq)
);
CREATE INDEX dsh_sessions_by_created ON dsh_sessions (created_at, id);
CREATE TABLE dsh_events (
	session_id text NOT NULL REFERENCES dsh_sessions (id),
	seq        bigint NOT NULL,
	type       text NOT NULL,
	time       bigint NOT NULL,
	pb         bytea NOT NULL,                  -- the event in protobuf binary
	PRIMARY KEY (session_id, seq)
);
CREATE TABLE dsh_leases (
	session_id text PRIMARY KEY,
	owner      text NOT NULL,                   -- replica id
	address    text NOT NULL,                   -- where peers forward RPCs
	epoch      bigint NOT NULL,                 -- +1 at every claim; fences appends
	expires_at timestamptz NOT NULL
);
-- A log for people, without a second copy per row: the columns plus the
-- payload size (dsh sessions dump renders whole events as JSON).
CREATE VIEW dsh_event_log AS
	SELECT session_id, seq, type, to_timestamp(time / 1000.0) AS at, octet_length(pb) AS bytes
	FROM dsh_events;
`,
}

// SchemaVersion is the schema version this build writes and reads.
var SchemaVersion = len(migrations)

// migrateLock is the advisory lock key that serialises migrations.
const migrateLock = 0x647368_7067 // "dshpg"

// migrate applies the missing migrations in one transaction and refuses a
// database whose schema is newer than this build, or that has dsh tables
// but no version.
func migrate(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
		return fmt.Errorf("pgstore: migration lock: %w", err)
	}
	var hasVersion, hasSessions bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('dsh_schema_version') IS NOT NULL, to_regclass('dsh_sessions') IS NOT NULL`).Scan(&hasVersion, &hasSessions); err != nil {
		return fmt.Errorf("pgstore: read schema: %w", err)
	}
	version := 0
	if hasVersion {
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM dsh_schema_version`).Scan(&version); err != nil {
			return fmt.Errorf("pgstore: read schema version: %w", err)
		}
	} else if _, err := tx.Exec(ctx, `CREATE TABLE dsh_schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("pgstore: create dsh_schema_version: %w", err)
	}
	switch {
	case version > SchemaVersion:
		return fmt.Errorf("pgstore: database schema version %d is newer than this build's %d (a newer dsh migrated it; run that version): %w",
			version, SchemaVersion, persistence.ErrUnknownVersion)
	case version == 0 && hasSessions:
		return fmt.Errorf("pgstore: database has dsh tables but no schema version: %w", persistence.ErrUnknownVersion)
	}
	for v := version; v < SchemaVersion; v++ {
		if _, err := tx.Exec(ctx, migrations[v]); err != nil {
			return fmt.Errorf("pgstore: migration to version %d: %w", v+1, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO dsh_schema_version (version) VALUES ($1)`, v+1); err != nil {
			return fmt.Errorf("pgstore: stamp schema version %d: %w", v+1, err)
		}
	}
	return nil
}
