package session

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func fullHeader(reason sessionv1.HeaderReason, model string) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{
		Reason: reason,
		Header: &sessionv1.EpochHeader{
			Config:        &llmv1.LlmCallConfig{Provider: "p", Model: model, Temperature: ptr(0.5), MaxTokens: ptr(int32(100)), Stop: []string{"END"}},
			System:        ptr("you are dsh"),
			Tools:         []*llmv1.ToolSchema{{Name: "read", Description: "read a file", Parameters: `{"type":"object"}`}},
			MessagePrefix: []*llmv1.Message{userMsg("prefix")},
		},
	}}}
}

// twoStepLog is a turn with two steps; the second step's request sees the
// first step's output and tool results but not what was appended after its
// own step/start.
func twoStepLog() *logBuilder {
	b := &logBuilder{}
	b.turnStart()
	b.user("question")
	b.stepStart()
	b.add(fullHeader(sessionv1.HeaderReason_HEADER_REASON_INITIAL, "m1"))
	b.chunk("x")
	b.assistant(Text("let me look"), ToolCallBlock("c1", "read", `{"path":"a"}`))
	c := b.call("c1")
	b.result("c1", c, "file a")
	b.context("file changed")
	b.stepEnd()
	b.stepStart()
	b.add(fullHeader(sessionv1.HeaderReason_HEADER_REASON_CHANGE, "m2"))
	b.context("late context, joins the next request")
	return b
}

func TestBuildRequest(t *testing.T) {
	t.Parallel()
	b := twoStepLog()
	got, err := BuildRequest(b.evs, "s1")
	if err != nil {
		t.Fatal(err)
	}
	want := &llmv1.GenerateRequest{
		Provider: "p", Model: "m2", System: ptr("you are dsh"),
		Tools:       []*llmv1.ToolSchema{{Name: "read", Description: "read a file", Parameters: `{"type":"object"}`}},
		Temperature: ptr(0.5), MaxTokens: ptr(int32(100)), Stop: []string{"END"}, SessionId: "s1",
		Messages: []*llmv1.Message{
			userMsg("prefix"),
			userMsg("question"),
			assistantMsg(Text("let me look"), ToolCallBlock("c1", "read", `{"path":"a"}`)),
			toolResultMsg("c1", "file a", false),
			userMsg("file changed"),
		},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("BuildRequest (-want +got):\n%s", diff)
	}
	if err := CheckRequest(b.evs, want); err != nil {
		t.Fatalf("CheckRequest: %v", err)
	}

	// Step 1 of the same log: its own header, history before its step/start.
	first, err := BuildRequestForStep(b.evs, 1, 1, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if first.GetModel() != "m1" || len(first.GetMessages()) != 2 {
		t.Fatalf("step 1 request: model %q, %d messages", first.GetModel(), len(first.GetMessages()))
	}
	second, err := BuildRequestForStep(b.evs, 1, 2, "s1")
	if err != nil || !proto.Equal(second, got) {
		t.Fatalf("BuildRequestForStep(step 2) differs from BuildRequest: %v", err)
	}
	if _, err := BuildRequestForStep(b.evs, 1, 3, "s1"); !errors.Is(err, ErrNoStep) {
		t.Fatalf("missing step: %v", err)
	}

	// The request is a copy: mutating it does not touch the log.
	got.Messages[1].Content[0].GetText().Text = "mutated"
	if b.evs[1].GetUserMessage().GetContent()[0].GetText().GetText() != "question" {
		t.Fatal("BuildRequest shares the log's content")
	}
}

func TestBuildRequestErrors(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	b.user("q")
	if _, err := BuildRequest(b.evs, "s"); !errors.Is(err, ErrNoStep) {
		t.Fatalf("no step: %v", err)
	}
	b.stepStart()
	if _, err := BuildRequest(b.evs, "s"); !errors.Is(err, ErrNoHeader) {
		t.Fatalf("no header: %v", err)
	}
}

func TestBuildRequestCanonicalHeader(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	b.user("q")
	b.stepStart()
	b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{
		Reason: sessionv1.HeaderReason_HEADER_REASON_INITIAL,
		Header: &sessionv1.EpochHeader{Config: &llmv1.LlmCallConfig{Provider: "p", Model: "m"}, System: ptr(""), Tools: []*llmv1.ToolSchema{}},
	}}})
	got, err := BuildRequest(b.evs, "s")
	if err != nil {
		t.Fatal(err)
	}
	if got.System != nil || got.Tools != nil || got.Temperature != nil {
		t.Fatalf("canonical request carries empty fields: %v", got)
	}
	if diff := cmp.Diff([]*llmv1.Message{userMsg("q")}, got.GetMessages(), protocmp.Transform()); diff != "" {
		t.Fatal(diff)
	}
}

func TestCheckRequestMismatch(t *testing.T) {
	t.Parallel()
	b := twoStepLog()
	good, err := BuildRequest(b.evs, "s1")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(r *llmv1.GenerateRequest)
		want   string
	}{
		{"no session id", func(r *llmv1.GenerateRequest) { r.SessionId = "" }, "no session id"},
		{"provider", func(r *llmv1.GenerateRequest) { r.Provider = "other" }, "provider"},
		{"model", func(r *llmv1.GenerateRequest) { r.Model = "m1" }, `model is "m1", the log says "m2"`},
		{"system", func(r *llmv1.GenerateRequest) { r.System = nil }, "system prompt"},
		{"tool changed", func(r *llmv1.GenerateRequest) { r.Tools[0].Description = "x" }, `tool 0 ("read")`},
		{"tool added", func(r *llmv1.GenerateRequest) { r.Tools = append(r.Tools, &llmv1.ToolSchema{Name: "x"}) }, "2 tools"},
		{"sampling", func(r *llmv1.GenerateRequest) { r.Stop = nil }, "sampling"},
		{"message changed", func(r *llmv1.GenerateRequest) { r.Messages[3] = userMsg("x") }, "message 3"},
		{"late context included", func(r *llmv1.GenerateRequest) {
			r.Messages = append(r.Messages, userMsg("late context, joins the next request"))
		}, "6 messages, the log gives 5"},
		{"prefix dropped", func(r *llmv1.GenerateRequest) { r.Messages = r.Messages[1:] }, "message 0"},
		{"purpose", func(r *llmv1.GenerateRequest) { r.Purpose = llmv1.Purpose_PURPOSE_COMPACTION }, "purpose"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := proto.CloneOf(good)
			tt.mutate(r)
			err := CheckRequest(b.evs, r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("CheckRequest = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestHeaderEqual(t *testing.T) {
	t.Parallel()
	base := func() *sessionv1.EpochHeader {
		return &sessionv1.EpochHeader{Config: &llmv1.LlmCallConfig{Provider: "p", Model: "m"}}
	}
	tests := []struct {
		name   string
		mutate func(h *sessionv1.EpochHeader)
		equal  bool
	}{
		{"identical", func(*sessionv1.EpochHeader) {}, true},
		{"empty system is absent", func(h *sessionv1.EpochHeader) { h.System = ptr("") }, true},
		{"empty tools are absent", func(h *sessionv1.EpochHeader) { h.Tools = []*llmv1.ToolSchema{} }, true},
		{"empty prefix is absent", func(h *sessionv1.EpochHeader) { h.MessagePrefix = []*llmv1.Message{} }, true},
		{"empty stop is absent", func(h *sessionv1.EpochHeader) { h.Config.Stop = []string{} }, true},
		{"system", func(h *sessionv1.EpochHeader) { h.System = ptr("s") }, false},
		{"model", func(h *sessionv1.EpochHeader) { h.Config.Model = "n" }, false},
		{"temperature set", func(h *sessionv1.EpochHeader) { h.Config.Temperature = ptr(0.0) }, false},
		{"stop", func(h *sessionv1.EpochHeader) { h.Config.Stop = []string{"x"} }, false},
		{"tools", func(h *sessionv1.EpochHeader) { h.Tools = []*llmv1.ToolSchema{{Name: "t"}} }, false},
		{"prefix", func(h *sessionv1.EpochHeader) { h.MessagePrefix = []*llmv1.Message{userMsg("p")} }, false},
		{"no config", func(h *sessionv1.EpochHeader) { h.Config = nil }, false},
		{"unknown field", func(h *sessionv1.EpochHeader) { h.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01}) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := base()
			tt.mutate(h)
			checkHeaderEqual(t, base(), h, tt.equal)
			// The log's fold keeps a canonical header as it is and
			// canonicalizes a copy of any other.
			c := canonicalShared(h)
			if !proto.Equal(c, CanonicalHeader(h)) {
				t.Fatalf("canonicalShared = %v, want %v", c, CanonicalHeader(h))
			}
			x := CanonicalHeader(h)
			canonical := (x.System == nil) == (h.System == nil) && (x.Tools == nil) == (h.Tools == nil) &&
				(x.MessagePrefix == nil) == (h.MessagePrefix == nil) && (x.GetConfig().GetStop() == nil) == (h.GetConfig().GetStop() == nil)
			if (c == h) != canonical {
				t.Fatalf("canonicalShared kept the header: %v, header canonical: %v", c == h, canonical)
			}
		})
	}
	// Equal tools and prefixes that are other copies (a header read back from
	// the log) and the very same pointers (a step reusing its tools).
	tools := []*llmv1.ToolSchema{{Name: "a", Parameters: `{"type":"object"}`}, {Name: "b"}}
	prefix := []*llmv1.Message{userMsg("p")}
	shared := func() *sessionv1.EpochHeader {
		h := base()
		h.Tools, h.MessagePrefix = tools, prefix
		return h
	}
	for _, tt := range []struct {
		name  string
		h     *sessionv1.EpochHeader
		equal bool
	}{
		{"same pointers", shared(), true},
		{"copies", &sessionv1.EpochHeader{Config: base().Config, Tools: []*llmv1.ToolSchema{proto.CloneOf(tools[0]), proto.CloneOf(tools[1])},
			MessagePrefix: []*llmv1.Message{proto.CloneOf(prefix[0])}}, true},
		{"a tool differs", &sessionv1.EpochHeader{Config: base().Config, Tools: []*llmv1.ToolSchema{tools[0], {Name: "c"}}, MessagePrefix: prefix}, false},
		{"fewer tools", &sessionv1.EpochHeader{Config: base().Config, Tools: tools[:1], MessagePrefix: prefix}, false},
		{"a prefix message differs", &sessionv1.EpochHeader{Config: base().Config, Tools: tools, MessagePrefix: []*llmv1.Message{userMsg("q")}}, false},
	} {
		t.Run("shared/"+tt.name, func(t *testing.T) {
			t.Parallel()
			checkHeaderEqual(t, shared(), tt.h, tt.equal)
		})
	}
	if !HeaderEqual(nil, nil) || HeaderEqual(nil, base()) {
		t.Fatal("nil headers")
	}
	h := base()
	h.System = ptr("")
	if c := CanonicalHeader(h); c.System != nil || h.System == nil {
		t.Fatal("CanonicalHeader must clear empty fields on a copy")
	}
	CanonicalizeHeader(h)
	if h.System != nil {
		t.Fatal("CanonicalizeHeader must clear empty fields in place")
	}
	// HeaderEqual compares these fields one by one: a field added to the
	// proto must be added there too.
	var names []string
	fields := h.ProtoReflect().Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		names = append(names, string(fields.Get(i).Name()))
	}
	if got := strings.Join(names, ","); got != "config,system,tools,message_prefix" {
		t.Fatalf("EpochHeader fields are %s: teach HeaderEqual and CanonicalizeHeader the new ones", got)
	}
}

// checkHeaderEqual checks HeaderEqual both ways against want and against
// its reference definition, equality of the canonical copies.
func checkHeaderEqual(t *testing.T, a, b *sessionv1.EpochHeader, want bool) {
	t.Helper()
	got := HeaderEqual(a, b)
	if got != want || HeaderEqual(b, a) != want {
		t.Fatalf("HeaderEqual = %v, want %v", got, want)
	}
	if ref := proto.Equal(CanonicalHeader(a), CanonicalHeader(b)); ref != want {
		t.Fatalf("proto.Equal of the canonical copies = %v, want %v", ref, want)
	}
}

func TestLogRequestHeaderFold(t *testing.T) {
	t.Parallel()
	b := twoStepLog()
	l, err := NewLog(nil, b.evs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(FoldRequestHeader(b.evs), l.RequestHeader(), protocmp.Transform()); diff != "" {
		t.Fatal(diff)
	}
	if l.RequestHeader().GetConfig().GetModel() != "m2" {
		t.Fatalf("fold keeps the last header, got %v", l.RequestHeader())
	}
	if FoldRequestHeader(b.evs[:3]) != nil {
		t.Fatal("fold before any header must be nil")
	}
	// The request equation through the Log: prefix ++ Messages() at the
	// boundary equals BuildRequest.
	boundary, _ := NewLog(nil, b.evs[:10]) // everything before step 2's step/start
	msgs := append(append([]*llmv1.Message{}, l.RequestHeader().GetMessagePrefix()...), boundary.Messages()...)
	req, _ := BuildRequest(b.evs, "s")
	if diff := cmp.Diff(req.GetMessages(), msgs, protocmp.Transform()); diff != "" {
		t.Fatal(diff)
	}
}
