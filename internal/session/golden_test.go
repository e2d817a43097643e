package session

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// representativeLog is a session exercising every core event type: a
// message turn with two steps (chunks, a header, tool calls and results,
// contexts, steering), a compaction replace over part of it, a tool-result
// prune, a blocked prompt, an injection turn, plugin events, and a turn cut
// off by a crash and repaired.
func representativeLog() []*sessionv1.SessionEvent {
	b := &logBuilder{}
	b.turnStart()
	b.user("List the Go files and read main.go.")
	b.stepStart()
	b.add(fullHeader(sessionv1.HeaderReason_HEADER_REASON_INITIAL, "m1"))
	first := b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: 1,
		Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "Looking."}}}}}})
	last := b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: 1,
		Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{
			Reason: &llmv1.FinishReason{Kind: &llmv1.FinishReason_ToolCalls{ToolCalls: &llmv1.FinishToolCalls{}}}, ReplayState: ptr(`{"sig":"s1"}`)}}}}}})
	am := assistantEvent(1, 1, Reasoning("two calls"), Text("Looking."), ToolCallBlock("c1", "glob", `{"pattern":"*.go"}`), ToolCallBlock("c2", "read", `{"path":"main.go"`))
	am.SourceEventSeqs = Seqs(first, last)
	am.GetAssistantMessage().Provenance.ReplayState = ptr(`{"sig":"s1"}`)
	am.GetAssistantMessage().Usage = &llmv1.TokenUsage{InputTokens: 120, OutputTokens: 30, CacheReadTokens: ptr(int64(1000))}
	amSeq := b.add(am)
	c1 := b.call("c1")
	r1 := b.result("c1", c1, "main.go\nlog.go")
	c2 := b.call("c2")
	bad := ToolResultEvent(1, 1, "c2", []*llmv1.ContentBlock{Text("invalid arguments: unexpected end of JSON")}, true,
		&toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}, c2)
	bad.GetToolResult().Meta = ptr(`{"attempt":1}`)
	badSeq := b.add(bad)
	ctx := ContextMessageEvent([]*llmv1.ContentBlock{Text("<system-reminder>main.go changed on disk</system-reminder>")}, PluginSource("fs"))
	ctx.GetContextMessage().Meta = ptr(`{"paths":["main.go"]}`)
	b.add(ctx)
	b.steering("Also count the lines.")
	b.stepEnd()
	b.stepStart()
	b.add(fullHeader(sessionv1.HeaderReason_HEADER_REASON_CHANGE, "m2"))
	b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TodoWrite{TodoWrite: &sessionv1.TodoWrite{Todos: []*sessionv1.TodoItem{
		{Content: "read main.go", Status: sessionv1.TodoStatus_TODO_STATUS_IN_PROGRESS}}}}})
	b.assistant() // a content-less anchor
	b.stepEnd()
	b.turnEnd()

	b.turnStart()
	two := int32(2)
	b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactStart{CompactStart: &sessionv1.CompactStart{
		Turn: &two, Trigger: sessionv1.CompactTrigger_COMPACT_TRIGGER_MANUAL}}})
	sum := UserMessageEvent([]*llmv1.ContentBlock{Text("<summary>The user asked for the Go files; main.go and log.go exist.</summary>")}, PluginSource("compact"))
	b.replace(sum, 1, r1, 1, amSeq, r1)
	b.replace(ToolResultEvent(1, 1, "c2", []*llmv1.ContentBlock{Text("[pruned]")}, true, &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}, -1), badSeq, badSeq, badSeq)
	b.evs[len(b.evs)-1].GetToolResult().Meta = ptr(`{"attempt":1}`)
	b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: &sessionv1.CompactEnd{Turn: &two}}})
	b.add(TurnEndEvent(2, completed()))
	b.turn = 2

	b.turnStart()
	b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_PromptBlocked{PromptBlocked: &sessionv1.PromptBlocked{
		Content: []*llmv1.ContentBlock{Text("rm -rf /")}, Source: UserSource(), Reason: "dangerous"}}})
	b.add(TurnEndEvent(3, &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Rejected{Rejected: &sessionv1.EndRejected{Reason: "dangerous"}}}))

	b.turn = 3
	b.turn++
	b.add(TurnStartEvent(4, InjectionTrigger(PluginSource("cron"))))
	b.context("cron: nightly build passed")
	b.add(TurnEndEvent(4, completed()))

	b.turnStart()
	b.user("Now fix the bug.")
	b.stepStart()
	b.add(fullHeader(sessionv1.HeaderReason_HEADER_REASON_RESUME, "m2"))
	b.assistant(ToolCallBlock("c3", "edit", `{"path":"main.go"}`), ToolCallBlock("c4", "bash", `{"cmd":"go test"}`))
	b.call("c3")
	// crash: c3 running, c4 never started
	return append(b.evs, InterruptedTurnClosers(b.evs)...)
}

func TestGoldenRepresentativeLog(t *testing.T) {
	t.Parallel()
	evs := representativeLog()
	if err := CheckLog(evs); err != nil {
		t.Fatalf("representative log: %v", err)
	}
	var events bytes.Buffer
	for _, ev := range evs {
		line, err := MarshalEventJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		events.Write(line)
		events.WriteByte('\n')
	}
	var msgs bytes.Buffer
	for _, m := range DeriveMessages(evs) {
		line, err := marshalCompact(m)
		if err != nil {
			t.Fatal(err)
		}
		msgs.Write(line)
		msgs.WriteByte('\n')
	}
	golden(t, "representative.events.jsonl", events.Bytes())
	golden(t, "representative.messages.jsonl", msgs.Bytes())

	// Loading the golden events reproduces the golden messages.
	f, err := os.Open(filepath.Join("testdata", "representative.events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var loaded []*sessionv1.SessionEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		ev, err := UnmarshalEventJSON(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		loaded = append(loaded, ev)
	}
	l, err := NewLog(&sessionv1.SessionHeader{Id: "golden"}, loaded)
	if err != nil {
		t.Fatalf("loading the golden log: %v", err)
	}
	var again bytes.Buffer
	for _, m := range l.Messages() {
		line, _ := marshalCompact(m)
		again.Write(line)
		again.WriteByte('\n')
	}
	want, _ := os.ReadFile(filepath.Join("testdata", "representative.messages.jsonl"))
	if !bytes.Equal(want, again.Bytes()) {
		t.Fatalf("messages derived from the loaded golden log differ:\n%s", again.Bytes())
	}
}

func marshalCompact(m proto.Message) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := compactJSON(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run Golden -update to create it)", err)
	}
	if !bytes.Equal(want, got) {
		t.Fatalf("%s differs from the golden file (run go test -run Golden -update and review the diff):\n%s", name, got)
	}
}
