package session

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// genLog drives a Log with random but valid events: turns, steps, chunks,
// assistant messages with tool calls, calls and results, contexts,
// steering, plugin events, headers, compaction replaces over arbitrary
// surface ranges (including earlier replacements) and tool-result pruning.
type genLog struct {
	r          *rand.Rand
	l          *Log
	turn, step int32
	turnOpen   bool
	stepOpen   bool
	uncalled   []string // tool-call ids of the step's assistant messages not yet called
	pending    []string // called, not answered
	callSeq    map[string]int64
	nextID     int
}

func newGen(seed uint64) *genLog {
	l, err := NewLog(&sessionv1.SessionHeader{Id: "prop"}, nil, WithTurnChecks())
	if err != nil {
		panic(err)
	}
	return &genLog{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), l: l, callSeq: map[string]int64{}}
}

func (g *genLog) text() string { return fmt.Sprintf("t%d", g.r.IntN(1000)) }

// next returns the next event to append.
func (g *genLog) next() *sessionv1.SessionEvent {
	r := g.r
	if !g.turnOpen {
		g.turn++
		g.turnOpen, g.step = true, 0
		return TurnStartEvent(g.turn, MessageTrigger(UserSource()))
	}
	for {
		switch k := r.IntN(20); {
		case k == 0:
			return UserMessageEvent([]*llmv1.ContentBlock{Text(g.text())}, UserSource())
		case k == 1:
			return ContextMessageEvent([]*llmv1.ContentBlock{Text(g.text())}, PluginSource("p"))
		case k == 2:
			return &sessionv1.SessionEvent{SurfaceOp: AppendOp(), Payload: &sessionv1.SessionEvent_SteeringMessage{
				SteeringMessage: &sessionv1.SteeringMessage{Turn: g.turn, Content: []*llmv1.ContentBlock{Text(g.text())}}}}
		case k == 3:
			return ExtensionEvent("plugin/event", fmt.Sprintf(`{"n":%d}`, r.IntN(9)))
		case k == 4:
			return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TodoWrite{TodoWrite: &sessionv1.TodoWrite{}}}
		case k == 5:
			if ev := g.compact(); ev != nil {
				return ev
			}
		case k == 6:
			if ev := g.prune(); ev != nil {
				return ev
			}
		case k == 7 && !g.stepOpen:
			if r.IntN(3) == 0 {
				g.turnOpen = false
				return TurnEndEvent(g.turn, completed())
			}
		case k == 8 && !g.stepOpen:
			g.step++
			g.stepOpen, g.uncalled, g.pending = true, nil, nil
			return StepStartEvent(g.turn, g.step)
		case k >= 9 && g.stepOpen:
			if ev := g.inStep(); ev != nil {
				return ev
			}
		}
	}
}

func (g *genLog) inStep() *sessionv1.SessionEvent {
	r := g.r
	switch r.IntN(7) {
	case 0:
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{
			Turn: g.turn, Step: g.step, Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: g.text()}}}}}}
	case 1:
		return headerEvent(g.text(), sessionv1.HeaderReason_HEADER_REASON_CHANGE)
	case 2:
		var blocks []*llmv1.ContentBlock
		for range r.IntN(4) { // sometimes empty: an anchor that derives nothing
			if r.IntN(2) == 0 {
				blocks = append(blocks, Text(g.text()))
			} else {
				g.nextID++
				id := fmt.Sprintf("c%d", g.nextID)
				g.uncalled = append(g.uncalled, id)
				blocks = append(blocks, ToolCallBlock(id, "read", "{"))
			}
		}
		return assistantEvent(g.turn, g.step, blocks...)
	case 3:
		if len(g.uncalled) > 0 {
			id := g.uncalled[0]
			g.uncalled = g.uncalled[1:]
			g.pending = append(g.pending, id)
			g.callSeq[id] = g.l.Len()
			return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{
				Turn: g.turn, Step: g.step, CallId: id, Name: "read", Arguments: "{"}}}
		}
	case 4:
		if len(g.pending) > 0 {
			i := r.IntN(len(g.pending))
			id := g.pending[i]
			g.pending = append(g.pending[:i], g.pending[i+1:]...)
			return ToolResultEvent(g.turn, g.step, id, []*llmv1.ContentBlock{Text(g.text())}, r.IntN(4) == 0, nil, g.callSeq[id])
		}
	case 5:
		if len(g.pending) == 0 && r.IntN(2) == 0 {
			g.stepOpen = false
			return StepEndEvent(g.turn, g.step)
		}
	case 6:
		return ContextMessageEvent([]*llmv1.ContentBlock{Text(g.text())}, PluginSource("batch"))
	}
	return nil
}

// compact replaces a random positional range of the surface with a summary.
func (g *genLog) compact() *sessionv1.SessionEvent {
	nodes, _ := g.l.Surface()
	if len(nodes) == 0 {
		return nil
	}
	i := g.r.IntN(len(nodes))
	j := i + g.r.IntN(min(len(nodes)-i, 4))
	ev := UserMessageEvent([]*llmv1.ContentBlock{Text("summary " + g.text())}, PluginSource("compact"))
	ev.SurfaceOp = ReplaceOp(nodes[i], nodes[j])
	ev.SourceEventSeqs = Seqs(nodes[i : j+1]...)
	return ev
}

// prune replaces a random tool/result node's content.
func (g *genLog) prune() *sessionv1.SessionEvent {
	nodes, _ := g.l.Surface()
	evs := g.l.Events()
	var results []int64
	for _, s := range nodes {
		if evs[s].GetToolResult() != nil {
			results = append(results, s)
		}
	}
	if len(results) == 0 {
		return nil
	}
	s := results[g.r.IntN(len(results))]
	ev := proto.CloneOf(evs[s])
	ev.Seq, ev.Time = 0, 0
	ev.GetToolResult().Content = []*llmv1.ContentBlock{Text("[pruned]")}
	ev.SurfaceOp = ReplaceOp(s, s)
	ev.SourceEventSeqs = Seqs(s)
	return ev
}

func messagesEqual(a, b []*llmv1.Message) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d messages vs %d", len(a), len(b))
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return fmt.Errorf("message %d differs: %v vs %v", i, a[i], b[i])
		}
	}
	return nil
}

func TestPropertyIncrementalDerivation(t *testing.T) {
	t.Parallel()
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			g := newGen(seed)
			for range 200 {
				before := g.l.Messages()
				ev, err := g.l.Append(g.next())
				if err != nil {
					t.Fatalf("generator produced an invalid event: %v", err)
				}
				after := g.l.Messages()
				// Deriving after every append equals deriving from scratch.
				if err := messagesEqual(DeriveMessages(g.l.Events()), after); err != nil {
					t.Fatalf("after seq %d (%s): incremental != scratch: %v", ev.GetSeq(), TypeName(ev), err)
				}
				// Non-surface events never change the derived history.
				if !IsSurfaceEvent(ev) {
					if len(before) != len(after) {
						t.Fatalf("non-surface %s changed the history length", TypeName(ev))
					}
					for i := range before {
						if before[i] != after[i] {
							t.Fatalf("non-surface %s changed message %d", TypeName(ev), i)
						}
					}
				}
			}
			evs := g.l.Events()
			if err := CheckLog(evs); err != nil {
				t.Fatalf("generated log fails CheckLog: %v", err)
			}
			// Replaying the log as a seed, also through JSON, reproduces the derivation.
			var decoded []*sessionv1.SessionEvent
			for _, ev := range evs {
				line, err := MarshalEventJSON(ev)
				if err != nil {
					t.Fatal(err)
				}
				back, err := UnmarshalEventJSON(line)
				if err != nil {
					t.Fatal(err)
				}
				decoded = append(decoded, back)
			}
			replay, err := NewLog(g.l.Header(), decoded)
			if err != nil {
				t.Fatalf("replaying the log: %v", err)
			}
			if err := messagesEqual(g.l.Messages(), replay.Messages()); err != nil {
				t.Fatalf("replay derivation differs: %v", err)
			}
			if !proto.Equal(g.l.RequestHeader(), replay.RequestHeader()) {
				t.Fatal("replay header fold differs")
			}
			// Repairing whatever turn is open yields a balanced valid log.
			repaired := append(append([]*sessionv1.SessionEvent{}, evs...), InterruptedTurnClosers(evs)...)
			if err := CheckLog(repaired); err != nil {
				t.Fatalf("repaired log: %v", err)
			}
			if InterruptedTurnClosers(repaired) != nil {
				t.Fatal("repaired log still open")
			}
		})
	}
}
