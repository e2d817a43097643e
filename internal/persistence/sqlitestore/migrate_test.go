package sqlitestore_test

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
)

// writeOld builds a database of an older schema version
// (testdata/schema-v1.sql: each event as JSON in data and protobuf in pb;
// testdata/schema-v2.sql: protobuf only), holding b's events as session "m"
// (published up to 2), then lets damage spoil rows.
func writeOld(t *testing.T, path string, version int, b *persistencetest.Builder, damage string) {
	t.Helper()
	schema, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("schema-v%d.sql", version)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h, err := persistence.MarshalHeader(persistencetest.Header("m"))
	if err != nil {
		t.Fatal(err)
	}
	type stmt struct {
		q    string
		args []any
	}
	stmts := []stmt{
		{string(schema), nil},
		{`INSERT INTO sessions (id, version, created_at, cwd, parent_session, delegation_depth, header, next_seq, published_next) VALUES ('m', 0, 1, '/w', '', 0, ?, ?, 2)`, []any{string(h), b.Len()}},
	}
	for _, ev := range b.Events() {
		pb, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if version == 2 {
			stmts = append(stmts, stmt{`INSERT INTO events (session_id, seq, type, time, pb) VALUES ('m', ?, ?, ?, ?)`, []any{ev.GetSeq(), session.TypeName(ev), ev.GetTime(), pb}})
			continue
		}
		js, err := session.MarshalEventJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		stmts = append(stmts, stmt{`INSERT INTO events (session_id, seq, type, time, data, pb) VALUES ('m', ?, ?, ?, ?, ?)`, []any{ev.GetSeq(), session.TypeName(ev), ev.GetTime(), string(js), pb}})
	}
	stmts = append(stmts, stmt{fmt.Sprintf("PRAGMA user_version = %d", version), nil})
	if damage != "" {
		stmts = append(stmts, stmt{damage, nil})
	}
	for _, st := range stmts {
		if _, err := db.Exec(st.q, st.args...); err != nil {
			t.Fatalf("%s: %v", st.q, err)
		}
	}
}

// userVersion returns a database's user_version and its number of events
// tables (1 before version 3, 0 after).
func userVersion(t *testing.T, path string) (version, events int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow("PRAGMA user_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 'events'`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	return version, events
}

// TestMigrateFromVersion1: Open migrates a version-1 database to one
// encoding per event without losing an event — a row whose protobuf is
// damaged is rebuilt from its JSON copy — and refuses (leaving version 1
// intact) when a row has no decodable copy at all.
func TestMigrateFromVersion1(t *testing.T) {
	t.Parallel()
	build := func(b *persistencetest.Builder) {
		b.CompletedTurn(3)
		b.CompletedTurn(2)
	}
	var b persistencetest.Builder
	build(&b)
	for _, tc := range []struct {
		name, damage string
		fails        bool
	}{
		{name: "intact"},
		{name: "a damaged protobuf", damage: `UPDATE events SET pb = x'ffffffff' WHERE seq = 3`},
		{name: "both copies damaged", damage: `UPDATE events SET pb = x'ffffffff', data = '{' WHERE seq = 3`, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "dsh.db")
			writeOld(t, path, 1, &b, tc.damage)
			s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: path})
			if tc.fails {
				var ce *persistence.CorruptError
				if err == nil || !errors.As(err, &ce) || ce.Seq != 3 {
					if s != nil {
						s.Close()
					}
					t.Fatalf("Open = %v, want a *CorruptError at seq 3", err)
				}
				if v, tables := userVersion(t, path); v != 1 || tables != 1 {
					t.Fatalf("after a refused migration: user_version %d, events tables %d; want 1, 1", v, tables)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			checkMigrated(t, s, path, build)
		})
	}
}

// checkMigrated checks a store migrated from b's session "m": every event
// intact, the published cursor kept, the storage checks clean, the current
// version without the events table, and the next append taken at the right seq.
func checkMigrated(t *testing.T, s *sqlitestore.Store, path string, build func(*persistencetest.Builder)) {
	t.Helper()
	var b persistencetest.Builder
	build(&b)
	_, got, err := s.Load(t.Context(), "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(b.Events()) {
		t.Fatalf("%d events after migration, want %d", len(got), len(b.Events()))
	}
	for i, ev := range b.Events() {
		if !proto.Equal(got[i], ev) {
			t.Fatalf("event %d changed by the migration:\n got %v\nwant %v", i, got[i], ev)
		}
	}
	if err := s.CheckStorage(t.Context(), "m"); err != nil {
		t.Fatalf("CheckStorage: %v", err)
	}
	if p, err := s.PublishedCursor(t.Context(), "m"); err != nil || p != 2 {
		t.Fatalf("published cursor %d, %v; want 2", p, err)
	}
	if v, tables := userVersion(t, path); v != sqlitestore.SchemaVersion || tables != 0 {
		t.Fatalf("user_version %d, events tables %d; want %d, 0", v, tables, sqlitestore.SchemaVersion)
	}
	var more persistencetest.Builder
	build(&more)
	more.CompletedTurn(1)
	next := more.Events()[b.Len():]
	if err := s.Append(t.Context(), "m", next); err != nil {
		t.Fatalf("append after the migration: %v", err)
	}
	if n, err := s.StoredLength(t.Context(), "m"); err != nil || n != more.Len() {
		t.Fatalf("StoredLength = %d, %v; want %d", n, err, more.Len())
	}
}

// TestMigrateFromVersion2: Open turns a version-2 database (one row per
// event, keyed by the text id, with a stored next_seq) into version 3 (one
// row per batch) without losing or changing a byte of an event — an event
// version 2 could not decode is carried over as it was, and Load reports it
// the same way — and refuses (leaving version 2 intact) when the rows are
// not exactly the stored log: a gap, or a row beyond next_seq.
func TestMigrateFromVersion2(t *testing.T) {
	t.Parallel()
	build := func(b *persistencetest.Builder) { b.CompletedTurn(3) }
	var b persistencetest.Builder
	build(&b)
	for _, tc := range []struct {
		name, damage string
		refusedAt    int64 // -1: the migration succeeds
		corruptAt    int64 // -1: Load succeeds
	}{
		{name: "intact", refusedAt: -1, corruptAt: -1},
		{name: "an undecodable event", damage: `UPDATE events SET pb = x'ffffffff' WHERE seq = 3`, refusedAt: -1, corruptAt: 3},
		{name: "a gap", damage: `DELETE FROM events WHERE seq = 3`, refusedAt: 3, corruptAt: -1},
		{name: "a row beyond the log", damage: `UPDATE sessions SET next_seq = next_seq - 1`, refusedAt: b.Len() - 1, corruptAt: -1},
		{name: "a row missing at the end", damage: `UPDATE sessions SET next_seq = next_seq + 1`, refusedAt: b.Len(), corruptAt: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "dsh.db")
			writeOld(t, path, 2, &b, tc.damage)
			s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: path})
			if tc.refusedAt >= 0 {
				var ce *persistence.CorruptError
				if err == nil || !errors.As(err, &ce) || ce.Seq != tc.refusedAt || ce.SessionID != "m" {
					if s != nil {
						s.Close()
					}
					t.Fatalf("Open = %v, want a *CorruptError of session m at seq %d", err, tc.refusedAt)
				}
				if v, tables := userVersion(t, path); v != 2 || tables != 1 {
					t.Fatalf("after a refused migration: user_version %d, events tables %d; want 2, 1", v, tables)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if tc.corruptAt < 0 {
				checkMigrated(t, s, path, build)
				return
			}
			var ce *persistence.CorruptError
			if _, _, err := s.Load(t.Context(), "m"); !errors.As(err, &ce) || ce.Seq != tc.corruptAt {
				t.Fatalf("Load = %v, want a *CorruptError at seq %d", err, tc.corruptAt)
			}
			db, err := sql.Open("sqlite", "file:"+path)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var pb []byte
			if err := db.QueryRow(`SELECT pb FROM batches`).Scan(&pb); err != nil || !bytes.Contains(pb, []byte{0x0a, 4, 0xff, 0xff, 0xff, 0xff}) {
				t.Fatalf("the undecodable event's bytes were not carried over: %x %v", pb, err)
			}
		})
	}
}

// v3Sessions is what testdata/v3.db holds (written by the version-3 store
// at 75d4015 with testdata/mkv3/main.go): per session, its turns (tool
// calls per completed turn) and its published cursor (0: never raised).
var v3Sessions = []struct {
	id     string
	turns  []int
	cursor int64
}{
	{"m", []int{3}, 2},
	{"n", []int{2, 1}, 32}, // published to its end
	{"o", []int{1}, 0},
}

// copyFile copies testdata's src to a fresh database path.
func copyFile(t *testing.T, src string) string {
	t.Helper()
	in, err := os.Open(filepath.Join("testdata", src))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	path := filepath.Join(t.TempDir(), "dsh.db")
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// columns returns the sessions table's columns as PRAGMA table_info gives
// them (name, type, not null, default, primary key), and whether the
// cursors table exists.
func columns(t *testing.T, path string) (cols []string, cursors bool) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name, type, "notnull", coalesce(dflt_value, ''), pk FROM pragma_table_info('sessions')`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name, typ, dflt string
			notNull, pk     int
		)
		if err := rows.Scan(&name, &typ, &notNull, &dflt, &pk); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, fmt.Sprintf("%s %s notnull=%d default=%q pk=%d", name, typ, notNull, dflt, pk))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 'cursors'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return cols, n == 1
}

// checkV3Sessions checks that s holds testdata/v3.db's sessions with every
// event and cursor intact, and takes the next append of each.
func checkV3Sessions(t *testing.T, s *sqlitestore.Store) {
	t.Helper()
	for _, x := range v3Sessions {
		var b persistencetest.Builder
		for _, k := range x.turns {
			b.CompletedTurn(k)
		}
		_, got, err := s.Load(t.Context(), x.id)
		if err != nil {
			t.Fatalf("Load(%s): %v", x.id, err)
		}
		if len(got) != len(b.Events()) {
			t.Fatalf("session %s: %d events, want %d", x.id, len(got), len(b.Events()))
		}
		for i, ev := range b.Events() {
			if !proto.Equal(got[i], ev) {
				t.Fatalf("session %s: event %d changed:\n got %v\nwant %v", x.id, i, got[i], ev)
			}
		}
		if err := s.CheckStorage(t.Context(), x.id); err != nil {
			t.Fatalf("CheckStorage(%s): %v", x.id, err)
		}
		if p, err := s.PublishedCursor(t.Context(), x.id); err != nil || p != x.cursor {
			t.Fatalf("session %s: published cursor %d, %v; want %d", x.id, p, err, x.cursor)
		}
		b.CompletedTurn(1)
		if err := s.Append(t.Context(), x.id, b.Events()[len(got):]); err != nil {
			t.Fatalf("session %s: append after the migration: %v", x.id, err)
		}
		if err := s.SetPublishedCursor(t.Context(), x.id, b.Len()); err != nil {
			t.Fatalf("session %s: raise the cursor after the migration: %v", x.id, err)
		}
		if p, err := s.PublishedCursor(t.Context(), x.id); err != nil || p != b.Len() {
			t.Fatalf("session %s: published cursor %d, %v after raising it; want %d", x.id, p, err, b.Len())
		}
	}
}

// TestMigrateFromVersion3 opens a real version-3 file (testdata/v3.db) and
// requires version 4: the published cursors moved into the cursors table
// (a row only for a raised one), the column gone from the sessions rows,
// every event byte for byte as it was, and the store writing on.
func TestMigrateFromVersion3(t *testing.T) {
	t.Parallel()
	path := copyFile(t, "v3.db")
	if v, _ := userVersion(t, path); v != 3 {
		t.Fatalf("testdata/v3.db is at version %d, want 3", v)
	}
	s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, tables := userVersion(t, path); v != 4 || tables != 0 {
		t.Fatalf("user_version %d, events tables %d; want 4, 0", v, tables)
	}
	cols, cursors := columns(t, path)
	if !cursors || strings.Contains(strings.Join(cols, ","), "published_next") {
		t.Fatalf("after the migration: cursors table %v, sessions columns %v; want the table and no published_next", cursors, cols)
	}
	// The migration's frozen copy of the v3 table must end where a fresh
	// file starts.
	fresh := filepath.Join(t.TempDir(), "fresh.db")
	fs, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: fresh})
	if err != nil {
		t.Fatal(err)
	}
	fs.Close()
	if want, _ := columns(t, fresh); strings.Join(cols, "\n") != strings.Join(want, "\n") {
		t.Fatalf("sessions columns after the migration:\n%s\nin a fresh file:\n%s", strings.Join(cols, "\n"), strings.Join(want, "\n"))
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM cursors`).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("%d cursor rows, %v; want 2 (the never-raised cursor has none)", rows, err)
	}
	checkV3Sessions(t, s)
}

// TestDowngradeScript: testdata/downgrade-v4-to-v3.sql (the documented way
// back to a version-3 build) turns a migrated database into one with the
// version-3 sessions table column for column, the cursors back in its rows
// and the version 3; this build then migrates it again without losing a
// cursor.
func TestDowngradeScript(t *testing.T) {
	t.Parallel()
	wantCols, _ := columns(t, copyFile(t, "v3.db"))
	path := copyFile(t, "v3.db")
	s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "downgrade-v4-to-v3.sql"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(string(script)); err != nil {
		t.Fatalf("the downgrade script: %v", err)
	}
	if v, _ := userVersion(t, path); v != 3 {
		t.Fatalf("user_version %d after the downgrade, want 3", v)
	}
	cols, cursors := columns(t, path)
	if cursors || strings.Join(cols, "\n") != strings.Join(wantCols, "\n") {
		t.Fatalf("after the downgrade: cursors table %v, sessions columns\n%s\nwant none and\n%s",
			cursors, strings.Join(cols, "\n"), strings.Join(wantCols, "\n"))
	}
	for _, x := range v3Sessions {
		var next int64
		if err := db.QueryRow(`SELECT published_next FROM sessions WHERE id = ?`, x.id).Scan(&next); err != nil || next != x.cursor {
			t.Fatalf("session %s: published_next %d, %v after the downgrade; want %d", x.id, next, err, x.cursor)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = sqlitestore.Open(t.Context(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatalf("open the downgraded database: %v", err)
	}
	defer s.Close()
	checkV3Sessions(t, s)
}
