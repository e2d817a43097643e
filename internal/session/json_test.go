package session

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestEventJSONRoundTrip(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	b.user("héllo \"quoted\"\n")
	b.stepStart()
	b.header("be brief")
	b.chunk("x")
	b.assistant(Text("a"), ToolCallBlock("c1", "read", `{"path":"a"`))
	c := b.call("c1")
	b.result("c1", c, "done")
	b.stepEnd()
	b.turnEnd()
	for _, ev := range b.evs {
		line, err := MarshalEventJSON(ev)
		if err != nil {
			t.Fatalf("marshal %d: %v", ev.GetSeq(), err)
		}
		if bytes.ContainsAny(line, "\n\r") {
			t.Fatalf("event %d is not one line: %s", ev.GetSeq(), line)
		}
		if bytes.Contains(line, []byte(": ")) || bytes.Contains(line, []byte(", ")) {
			t.Fatalf("event %d has insignificant whitespace: %s", ev.GetSeq(), line)
		}
		again, err := MarshalEventJSON(ev)
		if err != nil || !bytes.Equal(line, again) {
			t.Fatalf("marshal is not deterministic: %s vs %s (%v)", line, again, err)
		}
		back, err := UnmarshalEventJSON(line)
		if err != nil {
			t.Fatalf("unmarshal %s: %v", line, err)
		}
		if diff := cmp.Diff(ev, back, protocmp.Transform()); diff != "" {
			t.Fatalf("round trip (-want +got):\n%s", diff)
		}
	}
}

func TestEventJSONNames(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	b.user("x")
	line, err := MarshalEventJSON(b.evs[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"user_message":`, `"surface_op":{"append":{}}`, `"seq":"1"`} {
		if !strings.Contains(string(line), want) {
			t.Errorf("%s does not contain %s", line, want)
		}
	}
}

func TestUnmarshalEventJSONRejects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"seq":"1","bogus":1}`,
		`{"seq":"1","turn_start":{"turn":1,"extra":true}}`,
		`not json`,
		`{"seq":"x"}`,
	} {
		if _, err := UnmarshalEventJSON([]byte(in)); err == nil {
			t.Errorf("UnmarshalEventJSON(%s) succeeded, want error", in)
		}
	}
}
