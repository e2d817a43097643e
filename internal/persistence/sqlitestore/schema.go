package sqlitestore

// SchemaVersion is the PRAGMA user_version this build writes and reads. A
// fresh database (user_version 0 and no tables) is stamped with it; a
// version-1, -2 or -3 database is migrated (migrate.go); any other value is
// refused with persistence.ErrUnknownVersion.
//
// Version 2 dropped events.data, the second (JSON) copy of every event.
// Version 3 stores one row per appended batch, keyed by an integer session
// id, and derives the log length from the last batch instead of updating a
// sessions column on every append (docs/arch/throughput.md, "The SQLite
// store").
// Version 4 moves the published cursor out of the wide sessions row into
// a narrow cursors table (docs/arch/throughput.md §19): raising the cursors
// of many sessions in one commit dirties a page or two instead of a page per
// few sessions. A version-4 database goes back to version 3 with
// testdata/downgrade-v4-to-v3.sql (docs/arch/persistence.md).
const SchemaVersion = 4

// insertBatchSQL stores one batch row (the committer's prepared statement
// and the 2→3 migration share it).
const insertBatchSQL = `INSERT INTO batches (sid, seq, n, pb) VALUES (?, ?, ?, ?)`

// schema creates the tables. A sessions row is written by a session's first
// append, so List never returns a created-but-never-appended session (a
// version-2 database migrated may carry rows of sessions with no events).
//
// sessions.sid is the session's integer key (the rowid), which batches
// use: a 1-3 byte varint instead of the ~36-byte text id in every index
// entry. The log length is not stored: it is the seq + n of the session's
// last batch, one index seek (version 2 updated a next_seq column on every
// append, which dirtied one more page per appending session and commit).
// cursors holds the published cursor (the next seq not yet published) of
// each session whose cursor was ever raised, keyed by sid; a session
// without a row has published nothing. It is apart from sessions so that a
// raise rewrites a ~10-byte row among hundreds per page, not the session's
// wide row (its header as protojson).
//
// batches holds the log: one row per stored run of consecutive events
// (an Append's batch, split at about batchRowBytes), seq the first event's
// seq and n the number of events. pb is the events in protobuf binary,
// framed as the protobuf field 1 (length-delimited) repeated — a valid
// message `repeated dsh.session.v1.SessionEvent events = 1` — and Load
// decodes it (about ten times faster than protojson). People read a log as
// canonical JSON through the CLI (`dsh sessions events ID --json --data
// DIR`, which reads the file when no agent runs) or inspect.Dump. There is
// no foreign key: the committer takes sid from the sessions row in the same
// transaction (an FK would cost a lookup per insert).
const schema = `CREATE TABLE sessions ` + sessionsColumns + sessionsIndex + batchesTable + cursorsTable

const sessionsColumns = `(
	sid              INTEGER PRIMARY KEY,
	id               TEXT NOT NULL UNIQUE,
	version          INTEGER NOT NULL,
	created_at       INTEGER NOT NULL,
	cwd              TEXT NOT NULL,
	parent_session   TEXT NOT NULL,
	seed_length      INTEGER,
	delegation_depth INTEGER NOT NULL,
	header           TEXT NOT NULL               -- the full header as protojson
) STRICT;
`

// sessionsColumnsV3 is the version-3 sessions table (the published cursor a
// column of it); the 2→3 migration builds it and 3→4 moves the column out.
const sessionsColumnsV3 = `(
	sid              INTEGER PRIMARY KEY,
	id               TEXT NOT NULL UNIQUE,
	version          INTEGER NOT NULL,
	created_at       INTEGER NOT NULL,
	cwd              TEXT NOT NULL,
	parent_session   TEXT NOT NULL,
	seed_length      INTEGER,
	delegation_depth INTEGER NOT NULL,
	header           TEXT NOT NULL,              -- the full header as protojson
	published_next   INTEGER NOT NULL DEFAULT 0  -- next seq not yet published
) STRICT;
`

const sessionsIndex = `CREATE INDEX sessions_by_created ON sessions (created_at, id);
`

const batchesTable = `CREATE TABLE batches (
	sid  INTEGER NOT NULL,               -- sessions.sid
	seq  INTEGER NOT NULL,               -- the first event's seq
	n    INTEGER NOT NULL CHECK (n > 0), -- events in the row
	pb   BLOB NOT NULL,                  -- the events, framed protobuf binary
	PRIMARY KEY (sid, seq)
) STRICT;
`

const cursorsTable = `CREATE TABLE cursors (
	sid  INTEGER PRIMARY KEY,   -- sessions.sid
	next INTEGER NOT NULL       -- the next seq not yet published
) STRICT;
`

// nextSeqOf is the SQL expression of the stored log length of the session
// whose sid is the expression sid.
func nextSeqOf(sid string) string {
	return `coalesce((SELECT seq + n FROM batches WHERE sid = ` + sid + ` ORDER BY seq DESC LIMIT 1), 0)`
}
