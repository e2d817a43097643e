package jsonlstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/session"
)

func openAt(_ context.Context, dir string) (persistence.Store, error) {
	return Open(Config{Root: filepath.Join(dir, "sessions")})
}

func TestMain(m *testing.M) {
	persistencetest.MaybeRunCrashChild(openAt)
	os.Exit(m.Run())
}

func open(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(Config{Root: filepath.Join(dir, "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	persistencetest.Run(t, func(t *testing.T, dir string) persistence.Store { return open(t, dir) })
}

func TestCrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("short")
	}
	persistencetest.RunCrash(t, openAt, 8*time.Second)
}

func BenchmarkStore(b *testing.B) {
	persistencetest.Bench(b, func(b *testing.B, dir string) persistence.Store { return open(b, dir) })
}

// fixture stores a session with one completed turn and an open second turn
// and returns the store, the file path and the events.
func fixture(t *testing.T) (*Store, string, []*sessionv1.SessionEvent) {
	t.Helper()
	s := open(t, t.TempDir())
	t.Cleanup(func() { s.Close() })
	var b persistencetest.Builder
	b.CompletedTurn(2)
	b.StartTurn("second")
	b.StartStep()
	b.Chunks(2, "x")
	if err := s.Create(t.Context(), persistencetest.Header("f")); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "f", b.Events()); err != nil {
		t.Fatal(err)
	}
	path, err := s.Path("f")
	if err != nil {
		t.Fatal(err)
	}
	return s, path, b.Events()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// lineStart returns the offset of 1-based line n.
func lineStart(data []byte, n int) int {
	off := 0
	for range n - 1 {
		off += bytes.IndexByte(data[off:], '\n') + 1
	}
	return off
}

// TestTornTail: whatever follows the last committed turn/end and cannot be
// read is truncated, the open turn is closed, and the result is durable.
func TestTornTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tail func(good []byte) []byte // returns the bytes to append to the good file
	}{
		{"partial line", func([]byte) []byte { return []byte(`{"seq":"13","time":`) }},
		{"garbage line then a valid-looking line", func(good []byte) []byte {
			return []byte("\x00\x00\x00\n{\"seq\":\"14\"}\n")
		}},
		{"complete event line without newline", func(good []byte) []byte {
			return []byte(`{"seq":"13","time":"1767225600013","step_end":{"turn":2,"step":1}}`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, path, events := fixture(t)
			good := slices.Clip(readFile(t, path))
			writeFile(t, path, append(append([]byte(nil), good...), tt.tail(good)...))
			s.mu.Lock()
			s.sessions = map[string]*sess{} // forget the cached length, as a restart would
			s.mu.Unlock()
			_, got, err := s.Load(t.Context(), "f")
			if err != nil {
				t.Fatal(err)
			}
			want := append(append([]*sessionv1.SessionEvent(nil), events...), session.InterruptedTurnClosers(events)...)
			if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
			lines, err := persistence.EncodeBatch("f", int64(len(events)), want[len(events):])
			if err != nil {
				t.Fatal(err)
			}
			if after := readFile(t, path); !bytes.Equal(after, joinLines(good, lines)) {
				t.Fatalf("file is not the good prefix plus the closers:\n%s", after)
			}
		})
	}
}

// TestCorruptionRefused: an unreadable line at or before the last committed
// turn/end is refused with its line number and nothing is written.
func TestCorruptionRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line int
		with string
	}{
		{"garbage in the first turn", 3, "garbage"},
		{"seq gap in the first turn", 4, ""},
		{"truncated line before turn/end", 5, `{"seq":`},
		{"the turn/end itself", 0, `{"seq":`},
		{"a valid line that breaks an invariant", 4, `{"seq":"2","time":"1767225600002","step_start":{"turn":5,"step":1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, path, events := fixture(t)
			data := readFile(t, path)
			line := tt.line
			if line == 0 { // the last committed turn/end
				for i, ev := range events {
					if ev.GetTurnEnd() != nil {
						line = i + 2
					}
				}
			}
			lo := lineStart(data, line)
			hi := lo + bytes.IndexByte(data[lo:], '\n')
			var bad []byte
			if tt.with == "" {
				bad = append(append([]byte(nil), data[:lo]...), data[hi+1:]...) // drop the line
			} else {
				bad = append(append(append([]byte(nil), data[:lo]...), tt.with...), data[hi:]...)
			}
			// When the turn/end itself is broken a committed turn/end no
			// longer follows; make the next turn's end committed instead.
			if tt.line == 0 {
				bad = append(bad, data[lo:hi+1]...)
			}
			writeFile(t, path, bad)
			s.mu.Lock()
			s.sessions = map[string]*sess{}
			s.mu.Unlock()
			_, _, err := s.Load(t.Context(), "f")
			var ce *persistence.CorruptError
			if !errors.As(err, &ce) || ce.Line != line {
				t.Fatalf("Load: %v, want *CorruptError at line %d", err, line)
			}
			if after := readFile(t, path); !bytes.Equal(after, bad) {
				t.Fatal("a refused load changed the file")
			}
		})
	}
}

func TestUnknownFileVersion(t *testing.T) {
	t.Parallel()
	s, path, _ := fixture(t)
	data := readFile(t, path)
	writeFile(t, path, bytes.Replace(data, []byte(`"version":0`), []byte(`"version":3`), 1))
	if _, _, err := s.Load(t.Context(), "f"); !errors.Is(err, persistence.ErrUnknownVersion) {
		t.Fatalf("Load: %v, want ErrUnknownVersion", err)
	}
}

// TestFailedAppendTruncates injects a write that stops half way and fails:
// the file goes back to its previous length and the retry succeeds.
func TestFailedAppendTruncates(t *testing.T) {
	t.Parallel()
	s, path, events := fixture(t)
	before := readFile(t, path)
	b := persistencetest.Continue(events)
	b.EndStep()
	b.EndTurn()
	more := b.Events()[len(events):]
	s.write = func(path string, off int64, p []byte) error {
		if err := writeAt(path, off, p[:len(p)/2]); err != nil {
			return err
		}
		return errors.New("injected: no space left on device")
	}
	if err := s.Append(t.Context(), "f", more); err == nil {
		t.Fatal("Append succeeded through a failing write")
	}
	if after := readFile(t, path); !bytes.Equal(after, before) {
		t.Fatalf("file not rolled back: %d bytes, want %d", len(after), len(before))
	}
	s.write = writeAt
	if err := s.Append(t.Context(), "f", more); err != nil {
		t.Fatalf("retry: %v", err)
	}
	_, got, err := s.Load(t.Context(), "f")
	if err != nil || len(got) != int(b.Len()) {
		t.Fatalf("Load: %d events, %v; want %d", len(got), err, b.Len())
	}
}

func TestFileModesAndNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	ids := []string{"../escape", "a/b", ".", "..", "~002E", "CON", "x y", "日本", "😀"}
	for _, id := range ids {
		var b persistencetest.Builder
		b.CompletedTurn(1)
		if err := s.Create(t.Context(), persistencetest.Header(id)); err != nil {
			t.Fatalf("Create(%q): %v", id, err)
		}
		if err := s.Append(t.Context(), id, b.Events()); err != nil {
			t.Fatalf("Append(%q): %v", id, err)
		}
		if err := s.SetPublishedCursor(t.Context(), id, 1); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(dir, "sessions")
	if fi, err := os.Stat(root); err != nil || fi.Mode() != 0o700|os.ModeDir {
		t.Fatalf("root mode %v (%v), want drwx------", fi.Mode(), err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2*len(ids) + 1; len(entries) != want { // log + cursor per id, plus the lock
		t.Fatalf("%d entries under the root, want %d", len(entries), want)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o600 {
			t.Errorf("%s: mode %v, want -rw-------", e.Name(), fi.Mode())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "escape.jsonl")); err == nil {
		t.Fatal("an id escaped the root")
	}
	list, err := s.List(t.Context())
	if err != nil || len(list) != len(ids) {
		t.Fatalf("List: %d sessions (%v), want %d", len(list), err, len(ids))
	}
}

func TestSecondOpenRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := Open(Config{Root: filepath.Join(dir, "sessions"), LockTimeout: 50 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open: %v, want an in-use error", err)
	}
	s.Close()
	s2 := open(t, dir)
	s2.Close()
}

// TestCreateDoesNotOverwrite: a file that appeared under the id after Create
// (another writer) is never overwritten by the first append.
func TestCreateDoesNotOverwrite(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	defer s.Close()
	if err := s.Create(t.Context(), persistencetest.Header("o")); err != nil {
		t.Fatal(err)
	}
	path, _ := s.Path("o")
	writeFile(t, path, []byte("someone else's\n"))
	var b persistencetest.Builder
	b.CompletedTurn(1)
	if err := s.Append(t.Context(), "o", b.Events()); !errors.Is(err, persistence.ErrExists) {
		t.Fatalf("Append: %v, want ErrExists", err)
	}
	if got := readFile(t, path); string(got) != "someone else's\n" {
		t.Fatalf("file overwritten: %q", got)
	}
}

func TestEncodeID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id, want string
	}{
		{"abc-DEF_1.2", "abc-DEF_1.2"},
		{".", "~002E"},
		{"..", "~002E~002E"},
		{"../x", "..~002Fx"},
		{"a/b", "a~002Fb"},
		{"~", "~007E"},
		{"😀", "~D83D~DE00"},
		{"x y", "x~0020y"},
	}
	for _, tt := range tests {
		got, err := EncodeID(tt.id)
		if err != nil || got != tt.want {
			t.Errorf("EncodeID(%q) = %q, %v; want %q", tt.id, got, err, tt.want)
			continue
		}
		back, err := DecodeID(got)
		if err != nil || back != tt.id {
			t.Errorf("DecodeID(%q) = %q, %v; want %q", got, back, err, tt.id)
		}
	}
	for _, bad := range []string{"", "\xff", strings.Repeat("/", 100)} {
		if _, err := EncodeID(bad); err == nil {
			t.Errorf("EncodeID(%q) succeeded", bad)
		}
	}
	for _, bad := range []string{"~002e", "~00", "a/b", "~0041", "~D83D"} {
		if _, err := DecodeID(bad); err == nil {
			t.Errorf("DecodeID(%q) succeeded", bad)
		}
	}
}

func FuzzEncodeID(f *testing.F) {
	for _, s := range []string{"a", ".", "..", "../x", "~002E", "😀", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		name, err := EncodeID(id)
		if err != nil {
			return
		}
		if strings.ContainsAny(name, "/\\\x00") || name == "." || name == ".." || strings.HasPrefix(name, tmpPrefix) {
			t.Fatalf("EncodeID(%q) = %q: unsafe file name", id, name)
		}
		back, err := DecodeID(name)
		if err != nil || back != id {
			t.Fatalf("DecodeID(EncodeID(%q)) = %q, %v", id, back, err)
		}
	})
}

// TestReadOnlyNextToOwner: a read-only store reads a root its owner holds
// locked, and refuses to change it.
func TestReadOnlyNextToOwner(t *testing.T) {
	t.Parallel()
	owner, _, events := fixture(t)
	ro, err := Open(Config{Root: owner.root, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open next to the owner: %v", err)
	}
	defer ro.Close()
	got, err := ro.ReadEvents(t.Context(), "f", 0)
	if err != nil || len(got) != len(events) {
		t.Fatalf("ReadEvents: %d events, %v; want %d", len(got), err, len(events))
	}
	if list, err := ro.List(t.Context()); err != nil || len(list) != 1 {
		t.Fatalf("List: %v, %v", list, err)
	}
	if err := ro.Append(t.Context(), "f", events[:1]); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Append: %v, want ErrReadOnly", err)
	}
	if _, _, err := ro.Load(t.Context(), "f"); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Load: %v, want ErrReadOnly", err)
	}
	if err := ro.Create(t.Context(), persistencetest.Header("n")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Create: %v, want ErrReadOnly", err)
	}
	if _, err := Open(Config{Root: filepath.Join(t.TempDir(), "missing"), ReadOnly: true}); err == nil {
		t.Fatal("read-only Open of a missing root succeeded")
	}
}
