package sqlitestore

// SchemaVersion is the PRAGMA user_version this build writes and reads. A
// fresh database (user_version 0 and no tables) is stamped with it; a
// version-1 database is migrated (migrate.go); any other value is refused
// with persistence.ErrUnknownVersion.
//
// Version 2 dropped events.data, the second (JSON) copy of every event.
const SchemaVersion = 2

// schema creates the tables. A sessions row exists exactly when the session
// has at least one stored event (it is written by the first append), so List
// never returns a created-but-never-appended session.
//
// events.pb holds the whole event in protobuf binary form — its one
// encoding, which Load decodes (about ten times faster than protojson) —
// and type, seq and time are copied into columns for queries. People read a
// log as canonical JSON through the CLI (`dsh sessions events ID --json
// --data DIR`, which reads the file when no agent runs) or inspect.Dump;
// version 1 kept a JSON copy of every event in events.data, which cost
// about a fifth of the agent's CPU under load (docs/arch/throughput.md).
const schema = `
CREATE TABLE sessions (
	id               TEXT PRIMARY KEY,
	version          INTEGER NOT NULL,
	created_at       INTEGER NOT NULL,
	cwd              TEXT NOT NULL,
	parent_session   TEXT NOT NULL,
	seed_length      INTEGER,
	delegation_depth INTEGER NOT NULL,
	header           TEXT NOT NULL,              -- the full header as protojson
	next_seq         INTEGER NOT NULL,           -- stored log length
	published_next   INTEGER NOT NULL DEFAULT 0  -- next seq not yet published
) STRICT;
CREATE INDEX sessions_by_created ON sessions (created_at, id);
CREATE TABLE events (
	session_id TEXT NOT NULL REFERENCES sessions (id),
	seq        INTEGER NOT NULL,
	type       TEXT NOT NULL,
	time       INTEGER NOT NULL,
	pb         BLOB NOT NULL,              -- the event, protobuf binary
	PRIMARY KEY (session_id, seq)
) STRICT;
`
