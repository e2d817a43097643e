package compact

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

func TestPolicyOverride(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		base Policy
		o    *llmv1.CompactionPolicy
		want Policy
	}{
		{name: "defaults", want: Policy{ThresholdRatio: 0.8, RetainRatio: 0.16, MaxTokens: 8192, Retries: 1,
			PruneThresholdChars: 8192, PruneHeadChars: 4096, PruneTailChars: 1024}},
		{name: "route overrides the agent", base: Policy{ThresholdRatio: 0.5, Model: "small"},
			o: &llmv1.CompactionPolicy{ThresholdRatio: proto.Float64(0.9), RetainTokens: proto.Int64(500), MaxTokens: proto.Int32(100), Provider: "cheap", Disabled: true},
			want: Policy{ThresholdRatio: 0.9, RetainRatio: 0.16, RetainTokens: 500, MaxTokens: 100, Retries: 1, Provider: "cheap", Model: "small", Disabled: true,
				PruneThresholdChars: 8192, PruneHeadChars: 4096, PruneTailChars: 1024}},
		{name: "zero retries configured means none", o: &llmv1.CompactionPolicy{Retries: proto.Int32(0)},
			want: Policy{ThresholdRatio: 0.8, RetainRatio: 0.16, MaxTokens: 8192, Retries: 0,
				PruneThresholdChars: 8192, PruneHeadChars: 4096, PruneTailChars: 1024}},
	}
	for _, tc := range tests {
		if got := tc.base.override(tc.o).withDefaults(); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := (Policy{RetainRatio: 0.25}).retain(4000); got != 1000 {
		t.Errorf("retain 0.25 of 4000 = %d", got)
	}
	if got := (Policy{RetainRatio: 0.25, RetainTokens: 7}).retain(4000); got != 7 {
		t.Errorf("retain tokens override the ratio: %d", got)
	}
}

func TestCut(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("é", 50) + strings.Repeat("x", 100) + strings.Repeat("ü", 30)
	got := cut(s, 50, 30)
	if want := strings.Repeat("é", 50) + OmissionMarker + strings.Repeat("ü", 30); got != want {
		t.Fatalf("cut = %q", got)
	}
	if !utf8.ValidString(cut("ab€cd", 3, 1)) {
		t.Fatal("cut split a rune")
	}
}

func TestSelectOldest(t *testing.T) {
	t.Parallel()
	// user, a1(call), r1, a2(call), r2, a3 with these tokens.
	u := units{nodes: []int64{1, 9, 11, 19, 21, 29}, tokens: []int64{10, 20, 500, 20, 500, 10},
		balanced: []bool{true, true, false, true, false, true, true}, seen: 6}
	tests := []struct {
		name           string
		retain, budget int64
		want           []int64
		ok             bool
	}{
		{name: "keeps the tail", retain: 300, want: []int64{1, 9, 11}, ok: true},
		{name: "a tiny tail takes everything seen", retain: 5, want: []int64{1, 9, 11, 19, 21}, ok: true},
		{name: "the budget bounds the region", retain: 5, budget: 600, want: []int64{1, 9, 11}, ok: true},
		{name: "a budget below the first unit selects nothing but the user message", retain: 5, budget: 15, want: []int64{1}, ok: true},
		{name: "all tail", retain: 10_000, ok: false},
	}
	for _, tc := range tests {
		r, ok := u.selectOldest(tc.retain, tc.budget)
		if ok != tc.ok || (ok && !slicesEqual(r.seqs, tc.want)) {
			t.Errorf("%s: %v %v, want %v %v", tc.name, r.seqs, ok, tc.want, tc.ok)
		}
	}
	// Unseen input (after the last assistant message) is never selected.
	u.seen = 2 // the last assistant message is a1: r1 is unseen
	if r, _ := u.selectOldest(0, 0); !slicesEqual(r.seqs, []int64{1}) {
		t.Errorf("selected past the last assistant message: %v", r.seqs)
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type countingModels struct {
	calls int
	err   error
}

func (m *countingModels) ModelContext(context.Context, string, string) (*llmv1.ModelContext, error) {
	m.calls++
	if m.err != nil {
		return nil, m.err
	}
	return &llmv1.ModelContext{ContextWindow: 1000}, nil
}

func TestModelContextCached(t *testing.T) {
	t.Parallel()
	m := &countingModels{}
	c := New(nil, m, Policy{}, nil)
	now := time.Unix(0, 0)
	c.now = func() time.Time { return now }
	for range 3 {
		if mc := c.modelContext(t.Context(), "p", "m"); mc.GetContextWindow() != 1000 {
			t.Fatal(mc)
		}
	}
	if m.calls != 1 {
		t.Fatalf("%d gateway calls for one route, want 1 (cached)", m.calls)
	}
	now = now.Add(modelTTL)
	c.modelContext(t.Context(), "p", "m")
	if m.calls != 2 {
		t.Fatalf("the cache did not expire")
	}
	failing := &countingModels{err: errors.New("unimplemented")}
	c = New(nil, failing, Policy{}, nil)
	for range 3 {
		if mc := c.modelContext(t.Context(), "p", "m"); mc != nil {
			t.Fatal(mc)
		}
	}
	if failing.calls != 1 {
		t.Fatalf("%d calls to a failing gateway, want 1 (the failure is cached too)", failing.calls)
	}
	if r := (Reading{}); func() bool { _, ok := r.Ratio(); return ok }() {
		t.Fatal("an unknown window has a ratio")
	}
}

// TestPruneKeepsEverythingButContent: a pruned result differs from the
// original only in its content (view, meta, error included), which the
// log itself enforces on the replace; a second pass finds nothing.
func TestPruneKeepsEverythingButContent(t *testing.T) {
	t.Parallel()
	log, err := session.NewLog(&sessionv1.SessionHeader{Id: "p"}, nil, session.WithTurnChecks())
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("0123456789", 1000)
	tr := session.ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{session.Text(long), session.Text("short")}, true,
		&toolsv1.ToolErrorInfo{Name: "E", Code: "X"}, 3)
	tr.GetToolResult().Meta = proto.String(`{"k":1}`)
	tr.GetToolResult().View = &toolsv1.ToolResultView{}
	for _, ev := range []*sessionv1.SessionEvent{
		session.TurnStartEvent(1, session.MessageTrigger(session.UserSource())),
		session.UserMessageEvent([]*llmv1.ContentBlock{session.Text("go")}, session.UserSource()),
		session.StepStartEvent(1, 1),
		{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{Turn: 1, Step: 1, CallId: "c1", Name: "t"}}},
		tr,
	} {
		if _, err := log.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	s := Session{Log: log, Append: log.Append, Turn: 1}
	pruned, err := Prune(s, Policy{})
	if err != nil || len(pruned) != 1 {
		t.Fatalf("prune: %v %v", pruned, err)
	}
	p := pruned[0]
	if p.CharsBefore != 10_005 || p.CharsAfter != 4096+1024+utf8.RuneCountInString(OmissionMarker)+5 || p.OriginalSeq != 4 || p.ReplacementSeq != 5 {
		t.Errorf("pruned %+v", p)
	}
	got := log.Events()[5].GetToolResult()
	if got.GetContent()[1].GetText().GetText() != "short" || !strings.HasPrefix(got.GetContent()[0].GetText().GetText(), long[:4096]) {
		t.Errorf("pruned content %v", got.GetContent())
	}
	if again, err := Prune(s, Policy{}); err != nil || len(again) != 0 {
		t.Errorf("second prune: %v %v", again, err)
	}
}
