-- Takes a dsh SQLite session store from schema version 4 back to version 3
-- (for a build older than the cursors table). Run it with no agent using the
-- file, e.g. `sqlite3 -bail $DSH_DATA/sessions.db < downgrade-v4-to-v3.sql`
-- (DSH_DATA: .dsh under `dsh dev`, the agent's --data)
-- (-bail: without it the shell goes on after a failed statement, e.g. a
-- "database is locked", and commits the rest).
-- It puts each session's published cursor back into the sessions row and
-- drops the cursors table, in one transaction; the logs are not touched.
-- TestDowngradeScript (migrate_test.go) runs it.
BEGIN IMMEDIATE;
ALTER TABLE sessions ADD COLUMN published_next INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET published_next = (SELECT next FROM cursors WHERE cursors.sid = sessions.sid)
	WHERE sid IN (SELECT sid FROM cursors);
DROP TABLE cursors;
PRAGMA user_version = 3;
COMMIT;
