package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
)

// TestDevOneShotPublishesExactlyOnce: `dsh dev -p` exits without waiting
// for its embedded NATS to catch up; whatever it leaves unpublished stays
// behind the durable cursor and the next start publishes it. After two
// one-shot runs on one data directory, JetStream holds the first session's
// whole log exactly once, and the second's as a prefix without a gap or a
// duplicate.
func TestDevOneShotPublishesExactlyOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, ".dsh")
	for run := range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), devArgs(data, "-p", "run the two commands", "--yes")...)
		cmd.Dir = dir
		cmd.Env = cleanEnv("DSH_SCRIPT=" + script)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out)
		}
	}
	store, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: filepath.Join(data, "sessions.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	hs, err := store.List(t.Context())
	if err != nil || len(hs) != 2 {
		t.Fatalf("stored sessions %d (%v), want 2", len(hs), err)
	}
	nats := natstest.StartWith(t, natstest.Options{StoreDir: filepath.Join(data, "nats")})
	for i, h := range hs {
		_, log, err := store.Load(t.Context(), h.GetId())
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if i == 0 {
			want = len(log) // the second start published the first run's backlog
		}
		got := jetStreamEvents(t, nats.URL(), h.GetId(), want)
		if i == 0 && len(got) != len(log) {
			t.Fatalf("session 1: %d events in JetStream, %d stored", len(got), len(log))
		}
		if len(got) > len(log) {
			t.Fatalf("session %d: %d events in JetStream, only %d stored", i+1, len(got), len(log))
		}
		for k, ev := range got {
			if !proto.Equal(ev, log[k]) {
				t.Fatalf("session %d: JetStream message %d is seq %d, want the stored seq %d (a duplicate or a gap)", i+1, k, ev.GetSeq(), k)
			}
		}
	}
}
