package persistence

import (
	"bytes"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

func deltaChunk(seq, tm int64, turn, step int32, index uint32, text string, reasoning bool) *sessionv1.SessionEvent {
	c := &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: index, Text: text}}}
	if reasoning {
		c = &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: index, Text: text}}}
	}
	return &sessionv1.SessionEvent{Seq: seq, Time: tm, Payload: &sessionv1.SessionEvent_AssistantChunk{
		AssistantChunk: &sessionv1.AssistantChunk{Turn: turn, Step: step, Chunk: c}}}
}

// checkSame fails when the fast encoder accepts ev and its bytes differ from
// session.MarshalEventJSON's.
func checkSame(t *testing.T, ev *sessionv1.SessionEvent) bool {
	t.Helper()
	fast, ok := appendDeltaChunk(nil, ev)
	if !ok {
		return false
	}
	slow, err := session.MarshalEventJSON(ev)
	if err != nil {
		t.Fatalf("fast path encoded an event protojson refuses (%v): %s", err, fast)
	}
	if !bytes.Equal(fast, slow) {
		t.Fatalf("fast and protojson encodings differ:\nfast %s\nslow %s", fast, slow)
	}
	return true
}

func TestDeltaChunkJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ev   *sessionv1.SessionEvent
		fast bool
	}{
		{deltaChunk(5, 1_767_225_600_005, 1, 2, 0, "tok ", false), true},
		{deltaChunk(6, 7, 3, 1, 4, "think", true), true},
		{deltaChunk(7, 7, 3, 1, 0, "\x00\x01\x1f \" \\ / \b\f\n\r\t é \u2028 😀 \ufffd <>&", false), true},
		{deltaChunk(0, 7, 3, 1, 0, "seq 0", false), false},
		{deltaChunk(8, 7, 3, 1, 0, "", false), false},
		{deltaChunk(9, 7, 3, 1, 0, "bad \xff utf8", false), false},
		{session.StepEndEvent(1, 1), false},
		{func() *sessionv1.SessionEvent { // a delta with a batch after it: the batch must not be dropped
			ev := deltaChunk(10, 7, 3, 1, 0, "x", false)
			ev.GetAssistantChunk().Chunks = []*llmv1.StreamChunk{deltaChunk(0, 0, 0, 0, 0, "y", false).GetAssistantChunk().GetChunk()}
			return ev
		}(), false},
	}
	for _, tt := range tests {
		if got := checkSame(t, tt.ev); got != tt.fast {
			t.Errorf("%v: fast path %v, want %v", tt.ev, got, tt.fast)
		}
	}
}

func FuzzDeltaChunkJSON(f *testing.F) {
	f.Add(int64(5), int64(1_767_225_600_005), int32(1), int32(1), uint32(0), "tok ", false)
	f.Add(int64(9), int64(1), int32(2), int32(3), uint32(7), "\x00\"\\\u2028😀", true)
	f.Fuzz(func(t *testing.T, seq, tm int64, turn, step int32, index uint32, text string, reasoning bool) {
		checkSame(t, deltaChunk(seq, tm, turn, step, index, text, reasoning))
	})
}
