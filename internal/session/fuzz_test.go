package session

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// FuzzUnmarshalEventJSON: decoding never panics, and whatever decodes
// re-encodes to a canonical form that is a fixed point.
func FuzzUnmarshalEventJSON(f *testing.F) {
	for _, ev := range representativeLog() {
		line, err := MarshalEventJSON(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(line)
	}
	f.Add([]byte(`{"seq":"1","extension":{"type":"a/b","json":"{\"x\":1}"}}`))
	f.Add([]byte(`{"seq":1,"turn_end":{"turn":1,"reason":{"aborted":{}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := UnmarshalEventJSON(data)
		if err != nil {
			return
		}
		_ = CheckLog([]*sessionv1.SessionEvent{ev})
		_ = DeriveMessages([]*sessionv1.SessionEvent{ev})
		_ = InterruptedTurnClosers([]*sessionv1.SessionEvent{ev})
		first, err := MarshalEventJSON(ev)
		if err != nil {
			return // e.g. invalid UTF-8 smuggled through escapes cannot be re-encoded
		}
		back, err := UnmarshalEventJSON(first)
		if err != nil {
			t.Fatalf("canonical form does not decode: %v\n%s", err, first)
		}
		second, err := MarshalEventJSON(back)
		if err != nil || !bytes.Equal(first, second) {
			t.Fatalf("canonical form is not a fixed point:\n%s\n%s", first, second)
		}
	})
}

// eventsFromBytes builds a short, often invalid, event sequence from fuzz
// input, with small turn, step and seq numbers so rules are hit.
func eventsFromBytes(data []byte) []*sessionv1.SessionEvent {
	var out []*sessionv1.SessionEvent
	for len(data) >= 3 {
		k, a, c := data[0], int32(data[1]%3), int64(data[2]%8)
		data = data[3:]
		var ev *sessionv1.SessionEvent
		switch k % 14 {
		case 0:
			ev = TurnStartEvent(a+1, MessageTrigger(UserSource()))
		case 1:
			ev = TurnEndEvent(a+1, completed())
		case 2:
			ev = StepStartEvent(a/2+1, a+1)
		case 3:
			ev = StepEndEvent(a/2+1, a+1)
		case 4:
			ev = UserMessageEvent([]*llmv1.ContentBlock{Text("u")}, UserSource())
		case 5:
			ev = UserMessageEvent([]*llmv1.ContentBlock{Text("r")}, UserSource())
			ev.SurfaceOp, ev.SourceEventSeqs = ReplaceOp(c, c+int64(a)), Seqs(c, c+1, c+2)
		case 6:
			ev = assistantEvent(a/2+1, a+1, ToolCallBlock("c"+string(rune('0'+c%3)), "t", "{"))
		case 7:
			ev = &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{Turn: a/2 + 1, Step: a + 1, CallId: "c" + string(rune('0'+c%3))}}}
		case 8:
			ev = ToolResultEvent(a/2+1, a+1, "c"+string(rune('0'+c%3)), []*llmv1.ContentBlock{Text("x")}, false, nil, c)
		case 9:
			ev = ToolResultEvent(a/2+1, a+1, "c"+string(rune('0'+c%3)), []*llmv1.ContentBlock{Text("p")}, false, nil, -1)
			ev.SurfaceOp, ev.SourceEventSeqs = ReplaceOp(c, c), Seqs(c)
		case 10:
			ev = ToolResultEvent(a/2+1, a+1, "c9", nil, true, &toolsv1.ToolErrorInfo{Code: ToolNotStartedCode}, -1)
		case 11:
			ev = ExtensionEvent("x/y", "{}")
		case 12:
			ev = headerEvent("s", sessionv1.HeaderReason_HEADER_REASON_CHANGE)
		case 13:
			ev = ContextMessageEvent([]*llmv1.ContentBlock{Text("c")}, UserSource())
			if a == 2 {
				ev.SourceEventSeqs = Seqs(c)
			}
		}
		out = append(out, ev)
	}
	return out
}

// FuzzLogAgreesWithChecker: appending to a Log with turn checks accepts
// exactly the events a Checker accepts, a rejected append leaves the log as
// it was, crash repair of any accepted prefix yields a valid balanced log,
// and nothing panics.
func FuzzLogAgreesWithChecker(f *testing.F) {
	f.Add([]byte{0, 0, 0, 4, 0, 0, 2, 0, 0, 12, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 5, 3, 0, 0, 1, 0, 0})
	f.Add([]byte{0, 0, 0, 4, 0, 0, 4, 0, 0, 5, 1, 1, 5, 0, 3, 1, 0, 0})
	f.Add([]byte{0, 0, 0, 2, 0, 0, 7, 0, 0, 8, 0, 3, 9, 0, 4, 10, 0, 0, 3, 0, 0})
	f.Add([]byte{4, 0, 0, 1, 1, 1, 13, 2, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := NewLog(nil, nil, WithTurnChecks())
		if err != nil {
			t.Fatal(err)
		}
		var c Checker
		for _, ev := range eventsFromBytes(data) {
			ev.Seq = l.Len()
			before := l.Len()
			_, appendErr := l.Append(ev)
			var probe Checker
			for _, e := range l.Events() {
				if err := probe.Check(e); err != nil {
					t.Fatalf("the log holds an event the checker rejects: %v", err)
				}
			}
			checkErr := c.Check(ev)
			if (appendErr == nil) != (checkErr == nil) {
				t.Fatalf("Append: %v, Checker: %v", appendErr, checkErr)
			}
			if appendErr != nil {
				var ae *AppendError
				if !errors.As(appendErr, &ae) || l.Len() != before {
					t.Fatalf("bad rejection %v (len %d -> %d)", appendErr, before, l.Len())
				}
				break
			}
		}
		evs := l.Events()
		if err := messagesEqual(DeriveMessages(evs), l.Messages()); err != nil {
			t.Fatal(err)
		}
		trusted, err := NewLog(nil, append([]*sessionv1.SessionEvent(nil), evs...), WithTrustedSeed())
		if err != nil {
			t.Fatalf("trusted seed of a valid log: %v", err)
		}
		if err := messagesEqual(l.Messages(), trusted.Messages()); err != nil {
			t.Fatalf("trusted seed derives differently: %v", err)
		}
		if !proto.Equal(l.RequestHeader(), trusted.RequestHeader()) {
			t.Fatal("trusted seed folds the request header differently")
		}
		repaired := append(append([]*sessionv1.SessionEvent{}, evs...), InterruptedTurnClosers(evs)...)
		if err := CheckLog(repaired); err != nil {
			t.Fatalf("repair of a valid log is invalid: %v", err)
		}
	})
}
