package sqlitestore_test

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
// intact, the published cursor kept, the storage checks clean, version 3
// without the events table, and the next append taken at the right seq.
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
