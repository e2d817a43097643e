package sqlitestore_test

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
)

// writeV1 builds a schema-version-1 database (testdata/schema-v1.sql: each
// event as JSON in data and protobuf in pb) holding b's events as session
// "m", then lets damage spoil rows.
func writeV1(t *testing.T, path string, b *persistencetest.Builder, damage string) {
	t.Helper()
	schema, err := os.ReadFile(filepath.Join("testdata", "schema-v1.sql"))
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
	stmts := []struct {
		q    string
		args []any
	}{
		{string(schema), nil},
		{`INSERT INTO sessions (id, version, created_at, cwd, parent_session, delegation_depth, header, next_seq) VALUES ('m', 0, 1, '/w', '', 0, ?, ?)`, []any{string(h), b.Len()}},
	}
	for _, ev := range b.Events() {
		js, err := session.MarshalEventJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		pb, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		stmts = append(stmts, struct {
			q    string
			args []any
		}{`INSERT INTO events (session_id, seq, type, time, data, pb) VALUES ('m', ?, ?, ?, ?, ?)`, []any{ev.GetSeq(), session.TypeName(ev), ev.GetTime(), string(js), pb}})
	}
	stmts = append(stmts, struct {
		q    string
		args []any
	}{"PRAGMA user_version = 1", nil})
	if damage != "" {
		stmts = append(stmts, struct {
			q    string
			args []any
		}{damage, nil})
	}
	for _, st := range stmts {
		if _, err := db.Exec(st.q, st.args...); err != nil {
			t.Fatalf("%s: %v", st.q, err)
		}
	}
}

func userVersion(t *testing.T, path string) (version, dataCols int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow("PRAGMA user_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM pragma_table_info('events') WHERE name = 'data'`).Scan(&dataCols); err != nil {
		t.Fatal(err)
	}
	return version, dataCols
}

// TestMigrateFromVersion1: Open migrates a version-1 database to one
// encoding per event without losing an event — a row whose protobuf is
// damaged is rebuilt from its JSON copy — and refuses (leaving version 1
// intact) when a row has no decodable copy at all.
func TestMigrateFromVersion1(t *testing.T) {
	t.Parallel()
	var b persistencetest.Builder
	b.CompletedTurn(3)
	b.CompletedTurn(2)
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
			writeV1(t, path, &b, tc.damage)
			s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: path})
			if tc.fails {
				var ce *persistence.CorruptError
				if err == nil || !errors.As(err, &ce) || ce.Seq != 3 {
					if s != nil {
						s.Close()
					}
					t.Fatalf("Open = %v, want a *CorruptError at seq 3", err)
				}
				if v, cols := userVersion(t, path); v != 1 || cols != 1 {
					t.Fatalf("after a refused migration: user_version %d, data column %d; want 1, 1", v, cols)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
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
			if v, cols := userVersion(t, path); v != sqlitestore.SchemaVersion || cols != 0 {
				t.Fatalf("user_version %d, data column %d; want %d, 0", v, cols, sqlitestore.SchemaVersion)
			}
		})
	}
}
