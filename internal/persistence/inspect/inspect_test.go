package inspect_test

import (
	"bytes"
	"context"
	"database/sql"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/inspect"
	"github.com/dsh-dev/dsh/internal/persistence/jsonlstore"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
)

var update = flag.Bool("update", false, "rewrite the golden files")

type store interface {
	persistence.Store
	persistence.Reader
}

type backend struct {
	name string
	open func(t *testing.T, dir string) store
}

var backends = []backend{
	{"sqlite", func(t *testing.T, dir string) store {
		s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: filepath.Join(dir, "dsh.db")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"jsonl", func(t *testing.T, dir string) store {
		s, err := jsonlstore.Open(jsonlstore.Config{Root: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// sample stores a session with one completed turn and an open second turn.
func sample(t *testing.T, s store, id string) *persistencetest.Builder {
	t.Helper()
	var b persistencetest.Builder
	b.CompletedTurn(2)
	b.StartTurn("again")
	b.StartStep()
	if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), id, b.Events()); err != nil {
		t.Fatal(err)
	}
	return &b
}

func TestDumpGolden(t *testing.T) {
	t.Parallel()
	golden := filepath.Join("testdata", "dump.golden.jsonl")
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t, t.TempDir())
			sample(t, s, "golden")
			var buf bytes.Buffer
			if err := inspect.Dump(t.Context(), s, "golden", &buf); err != nil {
				t.Fatal(err)
			}
			if *update && be.name == "sqlite" {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), buf.String()); d != "" {
				t.Fatalf("dump differs from %s (-want +got):\n%s", golden, d)
			}
		})
	}
}

// TestDumpIsJSONLFormat: a dump placed under a JSONL root loads as the same
// session.
func TestDumpIsJSONLFormat(t *testing.T) {
	t.Parallel()
	src := backends[0].open(t, t.TempDir())
	b := sample(t, src, "moved")
	var buf bytes.Buffer
	if err := inspect.Dump(t.Context(), src, "moved", &buf); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "moved.jsonl"), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := backends[1].open(t, root)
	got, err := dst.ReadEvents(t.Context(), "moved", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(b.Events(), got, protocmp.Transform()); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t, t.TempDir())
			b := sample(t, s, "v")
			if err := s.SetPublishedCursor(t.Context(), "v", 5); err != nil {
				t.Fatal(err)
			}
			rep, err := inspect.Verify(t.Context(), s, "v")
			if err != nil {
				t.Fatal(err)
			}
			want := &inspect.Report{SessionID: "v", Header: persistencetest.Header("v"), Events: b.Len(), Published: 5, OpenTurn: 2, Closers: 2}
			if d := cmp.Diff(want, rep, protocmp.Transform()); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
			if _, _, err := s.Load(t.Context(), "v"); err != nil { // repairs
				t.Fatal(err)
			}
			reps, err := inspect.VerifyAll(t.Context(), s)
			if err != nil || len(reps) != 1 || !reps[0].OK() || reps[0].OpenTurn != 0 || reps[0].Events != b.Len()+2 {
				t.Fatalf("VerifyAll after repair = %+v, %v", reps, err)
			}
			if _, err := inspect.Verify(t.Context(), s, "missing"); persistence.Code(err) != persistence.CodeNotFound {
				t.Fatalf("Verify(missing): %v", err)
			}
		})
	}
}

func TestVerifyFindsProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		be     backend
		tamper func(t *testing.T, dir string)
		want   string
	}{
		{"sqlite undecodable event", backends[0], func(t *testing.T, dir string) {
			execSQL(t, dir, `UPDATE batches SET pb = CAST(x'0a02ffff' || pb AS BLOB), n = n + 1 WHERE sid = (SELECT sid FROM sessions WHERE id = 'p')`)
		}, "seq 0: pb"},
		{"sqlite batch count", backends[0], func(t *testing.T, dir string) {
			execSQL(t, dir, `UPDATE batches SET n = n + 1 WHERE sid = (SELECT sid FROM sessions WHERE id = 'p')`)
		}, "events framed, n = "},
		{"sqlite gap", backends[0], func(t *testing.T, dir string) {
			execSQL(t, dir, `UPDATE batches SET seq = 1 WHERE sid = (SELECT sid FROM sessions WHERE id = 'p')`)
		}, "batch row at seq 1, want 0"},
		{"jsonl torn tail", backends[1], func(t *testing.T, dir string) {
			appendFile(t, filepath.Join(dir, "p.jsonl"), `{"seq":`)
		}, "torn tail"},
		{"jsonl invariant broken", backends[1], func(t *testing.T, dir string) {
			path := filepath.Join(dir, "p.jsonl")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// Make step/start of turn 1 name turn 7.
			data = bytes.Replace(data, []byte(`"step_start":{"turn":1,`), []byte(`"step_start":{"turn":7,`), 1)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "invariant broken at seq 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := tt.be.open(t, dir)
			sample(t, s, "p")
			tt.tamper(t, dir)
			rep, err := inspect.Verify(t.Context(), s, "p")
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || !strings.Contains(strings.Join(rep.Problems, "\n"), tt.want) {
				t.Fatalf("problems %q, want one containing %q", rep.Problems, tt.want)
			}
		})
	}
}

func execSQL(t *testing.T, dir, q string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "dsh.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
