package sqlitestore

// SchemaVersion is the PRAGMA user_version this build writes and reads. A
// fresh database (user_version 0 and no tables) is stamped with it; any other
// value is refused with persistence.ErrUnknownVersion.
const SchemaVersion = 1

// schema creates the tables. A sessions row exists exactly when the session
// has at least one stored event (it is written by the first append), so List
// never returns a created-but-never-appended session.
//
// events.data holds the whole event as canonical JSON (session.MarshalEventJSON),
// readable with the sqlite3 CLI (`SELECT seq, type, data FROM events WHERE
// session_id = ? ORDER BY seq`); type, seq and time are copied into columns
// for queries. events.pb holds the same event in protobuf binary form, which
// Load decodes (about ten times faster than protojson, which keeps a
// 10,000-event load well under 100 ms); inspect.Verify checks that both
// forms agree.
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
	data       TEXT NOT NULL,              -- canonical JSON, for people
	pb         BLOB NOT NULL,              -- protobuf binary, for Load
	PRIMARY KEY (session_id, seq)
) STRICT;
`
