package agent_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// TestBatchedChunksLogTheSame: a turn whose model responses arrive in
// batches (GenerateResponse.chunks, which the agent asks for) leaves the
// very same log as the same chunks arriving one per response: one
// assistant/chunk event per chunk, in order, and everything after them
// alike. Table over groupings of the two steps' chunks.
func TestBatchedChunksLogTheSame(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakes.Tool{Name: "echo"})
	step1 := fakes.ToolCalls("looking", fakes.Call{ID: "c1", Name: "echo", Args: `{"a":1}`}, fakes.Call{ID: "c2", Name: "echo", Args: `{"b":2}`})
	step2 := fakes.Text("all done")
	// run plays one turn with the steps grouped as given and returns its
	// log with what differs between any two sessions (the session id and
	// the times) blanked.
	run := func(b1, b2 []int) []string {
		e.gw.Script(fakes.Response{Chunks: step1, Batches: b1}, fakes.Response{Chunks: step2, Batches: b2})
		id := e.create("").GetHeader().GetId()
		e.send(id, "hello")
		e.waitIdle(id)
		var out []string
		chunks := 0
		for _, ev := range e.events(id) {
			ev = proto.CloneOf(ev)
			ev.Time = 0
			if ev.GetAssistantChunk() != nil {
				chunks++
			}
			out = append(out, strings.ReplaceAll(protojson.Format(ev), id, "SID"))
		}
		if chunks != len(step1)+len(step2) {
			t.Fatalf("batches %v/%v: %d assistant/chunk events for %d chunks", b1, b2, chunks, len(step1)+len(step2))
		}
		return out
	}
	singles := run(nil, nil)
	for _, tt := range []struct {
		name   string
		b1, b2 []int
	}{
		{"each response whole", []int{len(step1)}, []int{len(step2)}},
		{"pairs", []int{2, 2, 2, 2, 2, 2}, []int{2, 2, 1}},
		{"uneven, then singles", []int{1, 4}, []int{3}},
	} {
		got := run(tt.b1, tt.b2)
		if len(got) != len(singles) {
			t.Fatalf("%s: %d events, singles %d", tt.name, len(got), len(singles))
		}
		for i := range got {
			if got[i] != singles[i] {
				t.Fatalf("%s: event %d differs:\nbatched %s\nsingles %s", tt.name, i, got[i], singles[i])
			}
		}
	}
	for i, r := range e.gw.Requests() {
		if !r.GetBatchChunks() {
			t.Fatalf("request %d did not ask for batches: the fake sent singles only", i)
		}
	}
}
