package main

import (
	"encoding/json"
	"strings"
	"testing"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"google.golang.org/protobuf/proto"
)

// TestCLIJSON: --json prints zero values and 64-bit integers as numbers,
// in nested messages, lists and oneofs alike, and leaves strings that look
// like numbers alone.
func TestCLIJSON(t *testing.T) {
	tests := []struct {
		name string
		msg  proto.Message
		want []string
	}{
		{"zero seq and time", &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TurnStart{TurnStart: &sessionv1.TurnStart{Turn: 1}}},
			[]string{`"seq":0`, `"time":0`, `"turn":1`, `"request_id":""`}},
		{"big int64", &sessionv1.SessionEvent{Seq: 9007199254740993, Time: 1764590000000,
			Payload: &sessionv1.SessionEvent_TurnEnd{TurnEnd: &sessionv1.TurnEnd{Turn: 2}}},
			[]string{`"seq":9007199254740993`, `"time":1764590000000`}},
		{"nested and numeric-looking strings", &agentv1.Session{NextSeq: 5, Header: &sessionv1.SessionHeader{Id: "123", CreatedAt: 7}},
			[]string{`"next_seq":5`, `"created_at":7`, `"id":"123"`, `"queued":0`}},
		{"list of messages", &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_UserMessage{UserMessage: &sessionv1.UserMessage{
			Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "42"}}}}}}},
			[]string{`"text":"42"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := cliJSON(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(b) || strings.Contains(string(b), "\n") {
				t.Fatalf("not one JSON line: %s", b)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("%s lacks %s", b, w)
				}
			}
		})
	}
}
