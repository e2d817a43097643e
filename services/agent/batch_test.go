package agent_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// TestBatchedChunksLogOneEventPerResponse: a turn whose model responses
// arrive in batches (GenerateResponse.chunks, which the agent asks for)
// logs one assistant/chunk event per response, holding that response's
// chunks in order; the chunks of the log's chunk events, read in seq order
// (session.Chunks), are exactly the chunks the singles' log holds, and
// everything else is the same log, each assistant/message naming its own
// step's chunk events as its sources. Table over groupings of the two
// steps' chunks.
func TestBatchedChunksLogOneEventPerResponse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakes.Tool{Name: "echo"})
	step1 := fakes.ToolCalls("looking", fakes.Call{ID: "c1", Name: "echo", Args: `{"a":1}`}, fakes.Call{ID: "c2", Name: "echo", Args: `{"b":2}`})
	step2 := fakes.Text("all done")
	// run plays one turn with the steps grouped as given and returns its
	// log normalised: one line per chunk (with its turn and step) and per
	// other event, with what differs between any two sessions (the id, the
	// times, the seqs) blanked and source seqs named by what they point
	// at; and the number of chunk events.
	run := func(b1, b2 []int) (lines []string, chunkEvents int) {
		e.gw.Script(fakes.Response{Chunks: step1, Batches: b1}, fakes.Response{Chunks: step2, Batches: b2})
		id := e.create("").GetHeader().GetId()
		e.send(id, "hello")
		e.waitIdle(id)
		evs := e.events(id)
		label := make(map[int64]string, len(evs))
		chunkSeqs := map[string][]int64{} // by turn.step
		others := 0
		for _, ev := range evs {
			if ac := ev.GetAssistantChunk(); ac != nil {
				k := fmt.Sprintf("%d.%d", ac.GetTurn(), ac.GetStep())
				label[ev.GetSeq()] = "chunks of " + k
				chunkSeqs[k] = append(chunkSeqs[k], ev.GetSeq())
				continue
			}
			label[ev.GetSeq()] = fmt.Sprintf("event %d", others) // counting the others only
			others++
		}
		for _, ev := range evs {
			if ac := ev.GetAssistantChunk(); ac != nil {
				chunkEvents++
				for c := range session.Chunks(ac) {
					lines = append(lines, fmt.Sprintf("chunk %d.%d %s", ac.GetTurn(), ac.GetStep(), protojson.Format(c)))
				}
				continue
			}
			if am := ev.GetAssistantMessage(); am != nil {
				k := fmt.Sprintf("%d.%d", am.GetTurn(), am.GetStep())
				if got, want := fmt.Sprint(ev.GetSourceEventSeqs().GetSeqs()), fmt.Sprint(chunkSeqs[k]); got != want {
					t.Fatalf("batches %v/%v: assistant/message of step %s has sources %s, its chunk events are %s", b1, b2, k, got, want)
				}
			}
			ev = proto.CloneOf(ev)
			ev.Seq, ev.Time = 0, 0
			var from []string
			for _, s := range ev.GetSourceEventSeqs().GetSeqs() {
				if len(from) == 0 || from[len(from)-1] != label[s] {
					from = append(from, label[s])
				}
			}
			ev.SourceEventSeqs = nil
			lines = append(lines, strings.ReplaceAll(protojson.Format(ev), id, "SID")+" from "+strings.Join(from, ", "))
		}
		return lines, chunkEvents
	}
	singles, n := run(nil, nil)
	if len(step1) != 11 || len(step2) != 5 {
		t.Fatalf("the steps have %d and %d chunks: the table counts responses for 11 and 5", len(step1), len(step2))
	}
	if n != len(step1)+len(step2) {
		t.Fatalf("singles: %d assistant/chunk events for %d chunks", n, len(step1)+len(step2))
	}
	for _, tt := range []struct {
		name      string
		b1, b2    []int
		responses int
	}{
		{"each response whole", []int{len(step1)}, []int{len(step2)}, 2},
		{"pairs", []int{2, 2, 2, 2, 2, 2}, []int{2, 2, 1}, 6 + 3}, // 11 and 5 chunks
		{"uneven, then singles", []int{1, 4}, []int{3}, 2 + 6 + 1 + 2},
	} {
		got, events := run(tt.b1, tt.b2)
		if events != tt.responses {
			t.Fatalf("%s: %d assistant/chunk events for %d responses", tt.name, events, tt.responses)
		}
		if len(got) != len(singles) {
			t.Fatalf("%s: %d chunks and other events, singles %d", tt.name, len(got), len(singles))
		}
		for i := range got {
			if got[i] != singles[i] {
				t.Fatalf("%s: line %d differs:\nbatched %s\nsingles %s", tt.name, i, got[i], singles[i])
			}
		}
	}
	for i, r := range e.gw.Requests() {
		if !r.GetBatchChunks() {
			t.Fatalf("request %d did not ask for batches: the fake sent singles only", i)
		}
	}
}
