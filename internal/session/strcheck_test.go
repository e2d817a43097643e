package session

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// stringPaths lists every string field reachable from md within depth
// message levels, as the field path from the root (a repeated or map field
// on the way contributes one element).
func stringPaths(md protoreflect.MessageDescriptor, depth int, prefix []protoreflect.FieldDescriptor, out *[][]protoreflect.FieldDescriptor) {
	if depth == 0 {
		return
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		path := append(append([]protoreflect.FieldDescriptor(nil), prefix...), fd)
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.StringKind {
				*out = append(*out, path)
			} else if fd.MapValue().Message() != nil {
				stringPaths(fd.MapValue().Message(), depth-1, path, out)
			}
		case fd.Kind() == protoreflect.StringKind:
			*out = append(*out, path)
		case fd.Message() != nil:
			stringPaths(fd.Message(), depth-1, path, out)
		}
	}
}

// setPath sets the string at the end of path (creating every message, list
// element or map entry on the way) to s.
func setPath(m protoreflect.Message, path []protoreflect.FieldDescriptor, s string) {
	fd := path[0]
	last := len(path) == 1
	switch {
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		key := protoreflect.ValueOfString("k").MapKey()
		switch fd.MapKey().Kind() {
		case protoreflect.StringKind:
		case protoreflect.BoolKind:
			key = protoreflect.ValueOfBool(true).MapKey()
		default:
			key = protoreflect.ValueOf(int64(1)).MapKey()
			if k := fd.MapKey().Kind(); k == protoreflect.Int32Kind || k == protoreflect.Sint32Kind || k == protoreflect.Sfixed32Kind {
				key = protoreflect.ValueOfInt32(1).MapKey()
			}
		}
		if last {
			mp.Set(key, protoreflect.ValueOfString(s))
			return
		}
		setPath(mp.Mutable(key).Message(), path[1:], s)
	case fd.IsList():
		l := m.Mutable(fd).List()
		if last {
			l.Append(protoreflect.ValueOfString(s))
			return
		}
		e := l.NewElement()
		setPath(e.Message(), path[1:], s)
		l.Append(e)
	case last:
		m.Set(fd, protoreflect.ValueOfString(s))
	default:
		setPath(m.Mutable(fd).Message(), path[1:], s)
	}
}

func pathName(path []protoreflect.FieldDescriptor) string {
	s := ""
	for _, fd := range path {
		s += "." + string(fd.Name())
	}
	return s[1:]
}

// TestCheckEventMatchesReflection: for every string field reachable from a
// SessionEvent (every payload, every chunk and block kind, nested content
// blocks), set alone to invalid UTF-8, to invalid JSON, to valid JSON and to
// the empty string, the direct checks give exactly the rule of the
// reflective walk — and a bad UTF-8 string is refused everywhere. A field
// added to the proto later is covered here without editing the test.
func TestCheckEventMatchesReflection(t *testing.T) {
	t.Parallel()
	var paths [][]protoreflect.FieldDescriptor
	stringPaths((&sessionv1.SessionEvent{}).ProtoReflect().Descriptor(), 6, nil, &paths)
	if len(paths) < 100 {
		t.Fatalf("only %d string paths found; the walk is broken", len(paths))
	}
	for _, path := range paths {
		for _, val := range []string{"a\xffb", "{", "{}", ""} {
			ev := &sessionv1.SessionEvent{}
			setPath(ev.ProtoReflect(), path, val)
			want := checkStrings(ev.ProtoReflect())
			got := checkEvent(ev)
			if got != want {
				t.Errorf("%s = %q: direct check %q, reflective walk %q", pathName(path), val, got, want)
			}
			if val == "a\xffb" && got == "" {
				t.Errorf("%s = invalid UTF-8 was accepted", pathName(path))
			}
			if cl, rule := cloneAndCheck(ev); rule != want || !proto.Equal(cl, ev) {
				t.Errorf("%s = %q: cloneAndCheck rule %q (want %q), clone equal %v", pathName(path), val, rule, want, proto.Equal(cl, ev))
			}
		}
	}
}

// TestCheckEventRefusesBadStrings is the table of the payloads a step
// produces, each with one bad string, through Log.Append.
func TestCheckEventRefusesBadStrings(t *testing.T) {
	t.Parallel()
	bad := "x\xc3"
	text := func(s string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
	}
	call := func(id, name, args string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: name, Arguments: args}}}
	}
	prov := &llmv1.AssistantProvenance{Provider: "p", Model: "m"}
	am := func(content []*llmv1.ContentBlock, pv *llmv1.AssistantProvenance) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{SurfaceOp: AppendOp(), SourceEventSeqs: Seqs(), Payload: &sessionv1.SessionEvent_AssistantMessage{
			AssistantMessage: &sessionv1.AssistantMessage{Turn: 1, Step: 1, Content: content, Provenance: pv}}}
	}
	tr := func(r *sessionv1.ToolResult) *sessionv1.SessionEvent {
		r.Turn, r.Step = 1, 1
		return &sessionv1.SessionEvent{SurfaceOp: AppendOp(), Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: r}}
	}
	chunk := func(c *llmv1.StreamChunk) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: 1, Chunk: c}}}
	}
	tests := []struct {
		name string
		ev   *sessionv1.SessionEvent
		rule string
	}{
		{"request id", &sessionv1.SessionEvent{RequestId: bad, Payload: &sessionv1.SessionEvent_StepStart{StepStart: &sessionv1.StepStart{Turn: 1, Step: 1}}}, "dsh.session.v1.SessionEvent.request_id is not valid UTF-8"},
		{"assistant text", am([]*llmv1.ContentBlock{text("ok"), text(bad)}, prov), "dsh.llm.v1.TextBlock.text is not valid UTF-8"},
		{"assistant tool-call id", am([]*llmv1.ContentBlock{call(bad, "read", "{}")}, prov), "dsh.llm.v1.ToolCallBlock.id is not valid UTF-8"},
		{"assistant tool-call arguments", am([]*llmv1.ContentBlock{call("c", "read", bad)}, prov), "dsh.llm.v1.ToolCallBlock.arguments is not valid UTF-8"},
		{"assistant provenance model", am(nil, &llmv1.AssistantProvenance{Provider: "p", Model: "m" + bad}), "dsh.llm.v1.AssistantProvenance.model is not valid UTF-8"},
		{"assistant replay state not JSON", am(nil, &llmv1.AssistantProvenance{Provider: "p", Model: "m", ReplayState: proto.String("{")}), "dsh.llm.v1.AssistantProvenance.replay_state is not valid JSON"},
		{"assistant extension block not JSON", am([]*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "x/y", Json: "{"}}}}, prov), "dsh.llm.v1.Extension.json is not valid JSON"},
		{"tool result call id", tr(&sessionv1.ToolResult{CallId: bad}), "dsh.session.v1.ToolResult.call_id is not valid UTF-8"},
		{"tool result content", tr(&sessionv1.ToolResult{CallId: "c", Content: []*llmv1.ContentBlock{text(bad)}}), "dsh.llm.v1.TextBlock.text is not valid UTF-8"},
		{"tool result meta empty", tr(&sessionv1.ToolResult{CallId: "c", Meta: proto.String("")}), "dsh.session.v1.ToolResult.meta is not valid JSON"},
		{"tool result error code", tr(&sessionv1.ToolResult{CallId: "c", IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "E", Code: bad}}), "dsh.tools.v1.ToolErrorInfo.code is not valid UTF-8"},
		{"tool call arguments", &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{Turn: 1, Step: 1, CallId: "c", Name: "read", Arguments: bad}}}, "dsh.session.v1.ToolCall.arguments is not valid UTF-8"},
		{"a good assistant message is taken", am([]*llmv1.ContentBlock{text("héllo"), call("c", "read", `{"p":"ü"}`)}, prov), ""},
		{"finish replay state", chunk(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{ReplayState: proto.String("nope")}}}), "dsh.llm.v1.FinishChunk.replay_state is not valid JSON"},
		{"finish failure message", chunk(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: &llmv1.FinishReason{Kind: &llmv1.FinishReason_Error{Error: &llmv1.FinishError{Failure: &llmv1.LlmFailure{Code: "X", Message: bad}}}}}}}), "dsh.llm.v1.LlmFailure.message is not valid UTF-8"},
		{"block end text", chunk(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Block: text(bad)}}}), "dsh.llm.v1.TextBlock.text is not valid UTF-8"},
		{"text delta", chunk(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: bad}}}), "dsh.llm.v1.TextDelta.text is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, err := NewLog(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = l.Append(tt.ev)
			if tt.rule == "" {
				if err != nil {
					t.Fatalf("Append: %v", err)
				}
				owned := proto.CloneOf(tt.ev)
				owned.Seq = 0
				got, err := l.AppendOwned(owned)
				if err != nil || got != owned || got.GetSeq() != 1 {
					t.Fatalf("AppendOwned = %p seq %d, %v; want the event itself at seq 1", got, got.GetSeq(), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.rule) {
				t.Fatalf("Append error = %v, want rule %q", err, tt.rule)
			}
			if l.Len() != 0 {
				t.Fatal("a refused event changed the log")
			}
			// Handed over without a copy: the same rule, and the
			// refused event is left as it was.
			owned := proto.CloneOf(tt.ev)
			owned.Seq, owned.Time = 0, 77
			if _, err := l.AppendOwned(owned); err == nil || !strings.Contains(err.Error(), tt.rule) {
				t.Fatalf("AppendOwned error = %v, want rule %q", err, tt.rule)
			}
			if owned.Seq != 0 || owned.Time != 77 || l.Len() != 0 {
				t.Fatalf("a refused owned event was changed (seq %d, time %d) or logged (len %d)", owned.Seq, owned.Time, l.Len())
			}
		})
	}
}

// BenchmarkCheckToolEvents is the content check of a `read` step's
// tool/call and tool/result events, with the views the built-in toolhost
// gives them (a generic card with a location; a generic result card).
func BenchmarkCheckToolEvents(b *testing.B) {
	line := int32(3)
	call := ToolCallEvent(1, 1, "call_1", "read", `{"file_path":"notes.txt"}`, &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{
		Title: "Read notes.txt", Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_READ, RawInput: "notes.txt",
		Locations: []*toolsv1.FileLocation{{Path: "notes.txt", Line: &line}}}}})
	result := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: &sessionv1.ToolResult{Turn: 1, Step: 1, CallId: "call_1",
		Content: []*llmv1.ContentBlock{Text(strings.Repeat("a line of notes\n", 40))},
		View:    &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: "Read notes.txt (lines 1-40 of 40)"}}}}}}
	b.ReportAllocs()
	for b.Loop() {
		if checkEvent(call) != "" || checkEvent(result) != "" {
			b.Fatal("refused")
		}
	}
}
