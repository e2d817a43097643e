package jsonlstore

import (
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

func chunkEvent(seq int64, reasoning bool, index uint32, text string) *sessionv1.SessionEvent {
	c := &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: index, Text: text}}}
	if reasoning {
		c = &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: index, Text: text}}}
	}
	return &sessionv1.SessionEvent{Seq: seq, Time: 1_767_225_600_000 + seq, Payload: &sessionv1.SessionEvent_AssistantChunk{
		AssistantChunk: &sessionv1.AssistantChunk{Turn: 3, Step: 2, Chunk: c}}}
}

// TestDeltaChunkFastPath: the lines MarshalEventJSON writes for delta chunks
// take the fast path and decode to the same event; other shapes decline.
func TestDeltaChunkFastPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ev   *sessionv1.SessionEvent
		fast bool
	}{
		{chunkEvent(7, false, 0, "tok "), true},
		{chunkEvent(8, true, 2, "thinking…"), true},
		{chunkEvent(9, false, 1, "quote \" backslash \\ newline \n tab \t nul \x00 é 😀 <>&"), true},
		{chunkEvent(0, false, 0, "seq 0 omits seq"), false},
		{chunkEvent(10, false, 0, ""), false},
		{session.StepEndEvent(1, 1), false},
	}
	for _, tt := range tests {
		line, err := session.MarshalEventJSON(tt.ev)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeDeltaChunk(line)
		if ok != tt.fast {
			t.Errorf("%s: fast path %v, want %v", line, ok, tt.fast)
			continue
		}
		if ok && !proto.Equal(got, tt.ev) {
			t.Errorf("%s: fast path decoded %v", line, got)
		}
	}
}

// FuzzDeltaChunk is a differential test: whenever the fast path accepts a
// line, protojson must decode the same event.
func FuzzDeltaChunk(f *testing.F) {
	for _, ev := range []*sessionv1.SessionEvent{chunkEvent(7, false, 0, "tok "), chunkEvent(12, true, 3, "a\"b\\c\u2028\n")} {
		line, err := session.MarshalEventJSON(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(line)
	}
	f.Add([]byte(`{"seq":"1","time":"2","assistant_chunk":{"turn":1,"step":1,"chunk":{"text_delta":{"text":"\ud800"}}}}`))
	f.Add([]byte(`{"seq":"01","time":"2","assistant_chunk":{"turn":1,"step":1,"chunk":{"text_delta":{"text":"x"}}}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		fast, ok := decodeDeltaChunk(line)
		if !ok {
			return
		}
		slow, err := persistence.DecodeEvent(line)
		if err != nil {
			t.Fatalf("fast path accepted %q, protojson refuses it: %v", line, err)
		}
		if !proto.Equal(fast, slow) {
			t.Fatalf("fast path and protojson disagree on %q:\nfast %v\nslow %v", line, fast, slow)
		}
	})
}
