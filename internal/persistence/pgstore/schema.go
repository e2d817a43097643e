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
-- dsh_append stores one batch in the caller's (implicit) transaction, in
-- one round trip: the fence (when p_owner is set: the lease row, locked FOR
-- SHARE, must name p_owner at p_epoch), the sessions row of a lazily
-- created session (when p_header is set), the seq check, the rows. Failures
-- raise SQLSTATEs the store maps to its typed errors: DSHFE fenced, DSHEX
-- exists, DSHNF not found, DSHSQ seq mismatch (message: the stored next seq).
CREATE FUNCTION dsh_append(p_id text, p_first bigint, p_owner text, p_epoch bigint,
	p_header text, p_version integer, p_created_at bigint, p_cwd text, p_parent text, p_seed_length bigint, p_depth integer,
	p_seqs bigint[], p_types text[], p_times bigint[], p_pbs bytea[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	cur_owner text;
	cur_epoch bigint;
	stored    bigint;
BEGIN
	IF p_owner <> '' THEN
		SELECT owner, epoch INTO cur_owner, cur_epoch FROM dsh_leases WHERE session_id = p_id FOR SHARE;
		IF NOT FOUND OR cur_owner <> p_owner OR cur_epoch <> p_epoch THEN
			RAISE EXCEPTION USING ERRCODE = 'DSHFE',
				MESSAGE = format('lease epoch %s was superseded by epoch %s of replica %L', p_epoch, coalesce(cur_epoch, 0), coalesce(cur_owner, ''));
		END IF;
	END IF;
	IF p_header IS NOT NULL THEN
		INSERT INTO dsh_sessions (id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header, next_seq)
			VALUES (p_id, p_version, p_created_at, p_cwd, p_parent, p_seed_length, p_depth, p_header, 0)
			ON CONFLICT (id) DO NOTHING;
		IF NOT FOUND THEN
			RAISE EXCEPTION USING ERRCODE = 'DSHEX', MESSAGE = 'session exists';
		END IF;
	END IF;
	UPDATE dsh_sessions SET next_seq = next_seq + cardinality(p_seqs) WHERE id = p_id AND next_seq = p_first;
	IF NOT FOUND THEN
		SELECT next_seq INTO stored FROM dsh_sessions WHERE id = p_id;
		IF NOT FOUND THEN
			RAISE EXCEPTION USING ERRCODE = 'DSHNF', MESSAGE = 'session not found';
		END IF;
		RAISE EXCEPTION USING ERRCODE = 'DSHSQ', MESSAGE = stored::text;
	END IF;
	INSERT INTO dsh_events (session_id, seq, type, time, pb)
		SELECT p_id, * FROM unnest(p_seqs, p_types, p_times, p_pbs);
END $$;
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
