package session

import (
	"iter"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// Chunks yields the stream chunks an assistant/chunk event holds, in stream
// order: its chunk, when set, then each of its chunks (the chunks the agent
// received together in one gateway response). A nil ac yields nothing, and
// so does a nil entry.
func Chunks(ac *sessionv1.AssistantChunk) iter.Seq[*llmv1.StreamChunk] {
	return func(yield func(*llmv1.StreamChunk) bool) {
		if c := ac.GetChunk(); c != nil && !yield(c) {
			return
		}
		for _, c := range ac.GetChunks() {
			if c != nil && !yield(c) {
				return
			}
		}
	}
}

// ChunkEvent is the assistant/chunk event of the chunks received together
// at a step: one chunk goes in `chunk`, as every event before batches did,
// several in `chunks`. The event, its payload wrapper and the AssistantChunk
// are made in one allocation (a step logs one such event per gateway
// response). The chunks become the event's: the caller must not mutate
// them afterwards.
func ChunkEvent(turn, step int32, chunks []*llmv1.StreamChunk) *sessionv1.SessionEvent {
	e := &struct {
		ev sessionv1.SessionEvent
		p  sessionv1.SessionEvent_AssistantChunk
		c  sessionv1.AssistantChunk
	}{}
	e.c.Turn, e.c.Step = turn, step
	if len(chunks) == 1 {
		e.c.Chunk = chunks[0]
	} else {
		e.c.Chunks = chunks
	}
	e.p.AssistantChunk = &e.c
	e.ev.Payload = &e.p
	return &e.ev
}
