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
