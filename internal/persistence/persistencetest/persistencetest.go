// Package persistencetest is the conformance suite every persistence.Store
// backend runs (semantics.md §9.2): round trips, crash repair on load, lazy
// creation and List, the published cursor, and the rejection of bad input
// with typed errors and nothing written.
//
// A backend's test calls Run with an Opener that opens a store over a
// directory; the suite gives every case a fresh directory and reopens a
// store over the same directory to check what is durable.
package persistencetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
)

// Opener opens a store over dir (the same dir yields the same stored data).
// The suite closes every store it opens.
type Opener func(t *testing.T, dir string) persistence.Store

// Run runs the conformance suite.
func Run(t *testing.T, open Opener) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"RoundTrip", testRoundTrip},
		{"HeaderRoundTrip", testHeaderRoundTrip},
		{"InterruptedTurnClosed", testInterruptedTurnClosed},
		{"UnstartedToolCallGetsRetryableResult", testUnstartedToolCall},
		{"LoggedCallWithoutResultGetsOutcomeUnknown", testLoggedCallNoResult},
		{"BalancedLogNotRepaired", testBalancedNotRepaired},
		{"ListExcludesNeverAppended", testListLazy},
		{"EmptyAppendIsNoop", testEmptyAppend},
		{"WrongFirstSeqRejected", testWrongFirstSeq},
		{"GapInBatchRejected", testGapInBatch},
		{"NonJSONPayloadRejected", testNonJSON},
		{"DuplicateCreateRejected", testDuplicateCreate},
		{"UnknownVersionRejected", testUnknownVersion},
		{"MissingSessionRejected", testMissing},
		{"CallerMutationIgnored", testCallerMutation},
		{"AppendAfterReopenWithoutLoad", testAppendAfterReopen},
		{"AppendAfterRepair", testAppendAfterRepair},
		{"PublishedCursor", testPublishedCursor},
		{"ConcurrentSessions", testConcurrent},
		{"BufferFlushRetriesAfterFailure", testBufferRetry},
		{"ClosedStore", testClosed},
		{"ReaderDoesNotRepair", testReader},
		{"DiscardFreesLazyIDs", testDiscard},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, &harness{t: t, dir: t.TempDir(), open: open})
		})
	}
}

type harness struct {
	t    *testing.T
	dir  string
	open Opener
	cur  persistence.Store
}

// store returns the open store, opening one if needed.
func (h *harness) store() persistence.Store {
	h.t.Helper()
	if h.cur == nil {
		s := h.open(h.t, h.dir)
		h.cur = s
		h.t.Cleanup(func() { s.Close() })
	}
	return h.cur
}

// reopen closes the store and opens a new one over the same directory.
func (h *harness) reopen() persistence.Store {
	h.t.Helper()
	if h.cur != nil {
		if err := h.cur.Close(); err != nil {
			h.t.Fatalf("Close: %v", err)
		}
		h.cur = nil
	}
	return h.store()
}

// created creates a session and appends batches of the given sizes from b.
func (h *harness) created(id string, b *Builder, batches ...int) {
	h.t.Helper()
	s := h.store()
	if err := s.Create(h.t.Context(), Header(id)); err != nil {
		h.t.Fatalf("Create(%q): %v", id, err)
	}
	h.append(id, b.Events(), batches...)
}

func (h *harness) append(id string, events []*sessionv1.SessionEvent, batches ...int) {
	h.t.Helper()
	if len(batches) == 0 {
		batches = []int{len(events)}
	}
	for _, n := range batches {
		if n > len(events) {
			n = len(events)
		}
		if err := h.store().Append(h.t.Context(), id, events[:n]); err != nil {
			h.t.Fatalf("Append(%q, seq %d..): %v", id, events[0].GetSeq(), err)
		}
		events = events[n:]
	}
	if len(events) > 0 {
		if err := h.store().Append(h.t.Context(), id, events); err != nil {
			h.t.Fatalf("Append(%q): %v", id, err)
		}
	}
}

func (h *harness) load(id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent) {
	h.t.Helper()
	hd, evs, err := h.store().Load(h.t.Context(), id)
	if err != nil {
		h.t.Fatalf("Load(%q): %v", id, err)
	}
	for i, ev := range evs {
		if ev.GetSeq() != int64(i) {
			h.t.Fatalf("Load(%q): events[%d].Seq = %d", id, i, ev.GetSeq())
		}
	}
	return hd, evs
}

func diffEvents(want, got []*sessionv1.SessionEvent) string {
	return cmp.Diff(want, got, protocmp.Transform())
}

// sameBytes reports the first event whose canonical JSON differs.
func sameBytes(t *testing.T, want, got []*sessionv1.SessionEvent) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range want {
		a, err := session.MarshalEventJSON(want[i])
		if err != nil {
			t.Fatal(err)
		}
		b, err := session.MarshalEventJSON(got[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("event %d not byte-identical:\nwant %s\ngot  %s", i, a, b)
		}
	}
}

func testRoundTrip(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(5)
	b.CompletedTurn(3)
	h.created("s1", &b, 1, 7, 3)
	_, got := h.load("s1")
	sameBytes(t, b.Events(), got)
	h.reopen()
	hd, got := h.load("s1")
	if d := diffEvents(b.Events(), got); d != "" {
		t.Fatalf("after reopen (-want +got):\n%s", d)
	}
	if d := cmp.Diff(Header("s1"), hd, protocmp.Transform()); d != "" {
		t.Fatalf("header (-want +got):\n%s", d)
	}
}

func testHeaderRoundTrip(t *testing.T, h *harness) {
	seed := int64(4)
	want := &sessionv1.SessionHeader{
		Id: "child/../weird id ☃", CreatedAt: BaseTime + 7, Cwd: "/home/u/proj", ParentSession: "parent-1",
		SeedLength: &seed, DelegationDepth: 2,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "m1", SystemPrompt: "be brief", Toolhosts: []string{"a", "b"}},
	}
	var b Builder
	b.CompletedTurn(1)
	given := proto.CloneOf(want)
	if err := h.store().Create(t.Context(), given); err != nil {
		t.Fatal(err)
	}
	given.Cwd = "/mutated/after/create" // the store must have taken a copy
	h.append(want.Id, b.Events())
	h.reopen()
	got, _ := h.load(want.Id)
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Fatalf("header (-want +got):\n%s", d)
	}
	list, err := h.store().List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]*sessionv1.SessionHeader{want}, list, protocmp.Transform()); d != "" {
		t.Fatalf("List (-want +got):\n%s", d)
	}
}

// checkRepair loads id twice (reopening in between) and checks that the
// closers are the kernel's, were written once, and are durable.
func checkRepair(t *testing.T, h *harness, id string, stored []*sessionv1.SessionEvent) []*sessionv1.SessionEvent {
	t.Helper()
	want := append(append([]*sessionv1.SessionEvent(nil), stored...), session.InterruptedTurnClosers(stored)...)
	_, got := h.load(id)
	if d := diffEvents(want, got); d != "" {
		t.Fatalf("first load (-want +got):\n%s", d)
	}
	last := got[len(got)-1]
	if last.GetTurnEnd().GetReason().GetInterrupted() == nil {
		t.Fatalf("last event %s is not turn/end {interrupted}", session.TypeName(last))
	}
	_, again := h.load(id)
	if d := diffEvents(want, again); d != "" {
		t.Fatalf("second load repaired again (-want +got):\n%s", d)
	}
	h.reopen()
	_, durable := h.load(id)
	if d := diffEvents(want, durable); d != "" {
		t.Fatalf("closers not durable (-want +got):\n%s", d)
	}
	return got
}

func testInterruptedTurnClosed(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(2)
	b.StartTurn("second")
	b.StartStep()
	b.Chunks(4, "partial ")
	h.created("s", &b, 5, 100)
	got := checkRepair(t, h, "s", b.Events())
	closers := got[b.Len():]
	if len(closers) != 2 || session.TypeName(closers[0]) != session.TypeStepEnd || session.TypeName(closers[1]) != session.TypeTurnEnd {
		t.Fatalf("closers = %v, want step/end, turn/end", typeNames(closers))
	}
	if closers[1].GetTime() != b.Events()[b.Len()-1].GetTime() {
		t.Fatalf("closer time %d, want the last event's time", closers[1].GetTime())
	}
}

func testUnstartedToolCall(t *testing.T, h *harness) {
	var b Builder
	b.StartTurn("go")
	b.StartStep()
	b.AssistantMessage("", "c1")
	h.created("s", &b)
	got := checkRepair(t, h, "s", b.Events())
	r := got[b.Len()]
	if r.GetToolResult().GetCallId() != "c1" || !r.GetToolResult().GetIsError() ||
		r.GetToolResult().GetError().GetCode() != session.ToolNotStartedCode {
		t.Fatalf("first closer = %v, want a TOOL_NOT_STARTED result for c1", r)
	}
}

func testLoggedCallNoResult(t *testing.T, h *harness) {
	var b Builder
	b.StartTurn("go")
	b.StartStep()
	b.AssistantMessage("", "c1", "c2")
	c1 := b.ToolCall("c1")
	b.ToolResult("c1", c1)
	c2 := b.ToolCall("c2")
	h.created("s", &b)
	got := checkRepair(t, h, "s", b.Events())
	r := got[b.Len()]
	if r.GetToolResult().GetCallId() != "c2" || r.GetToolResult().GetError().GetCode() != session.ToolOutcomeUnknownCode ||
		!slices.Equal(r.GetSourceEventSeqs().GetSeqs(), []int64{c2}) {
		t.Fatalf("first closer = %v, want TOOL_OUTCOME_UNKNOWN for c2 sourced from seq %d", r, c2)
	}
}

func testBalancedNotRepaired(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	h.created("s", &b)
	_, got := h.load("s")
	if d := diffEvents(b.Events(), got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func testListLazy(t *testing.T, h *harness) {
	s := h.store()
	for _, id := range []string{"a", "b"} {
		if err := s.Create(t.Context(), Header(id)); err != nil {
			t.Fatal(err)
		}
	}
	if got := listIDs(t, s); len(got) != 0 {
		t.Fatalf("List = %v before any append, want none", got)
	}
	var b Builder
	b.CompletedTurn(1)
	h.append("b", b.Events())
	if got := listIDs(t, s); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("List = %v, want [b]", got)
	}
	s = h.reopen()
	if got := listIDs(t, s); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("List after reopen = %v, want [b]", got)
	}
	// The never-appended session was not stored: its id is free again.
	if err := s.Create(t.Context(), Header("a")); err != nil {
		t.Fatalf("Create(a) after reopen: %v", err)
	}
}

func testEmptyAppend(t *testing.T, h *harness) {
	s := h.store()
	if err := s.Create(t.Context(), Header("e")); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(t.Context(), "e", nil); err != nil {
		t.Fatalf("empty Append: %v", err)
	}
	if got := listIDs(t, s); len(got) != 0 {
		t.Fatalf("List = %v after an empty append, want none (still lazy)", got)
	}
	if _, _, err := s.Load(t.Context(), "e"); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("Load of a never-appended session: %v, want ErrNotFound", err)
	}
}

// rejected checks that an append fails with an error of type E and that the
// stored log is still want.
func rejected[E error](t *testing.T, h *harness, id string, batch []*sessionv1.SessionEvent, want []*sessionv1.SessionEvent) E {
	t.Helper()
	err := h.store().Append(t.Context(), id, batch)
	var target E
	if !errors.As(err, &target) {
		t.Fatalf("Append: %v, want %T", err, target)
	}
	if persistence.Code(err) == "" {
		t.Fatalf("Append error %v has no Code()", err)
	}
	if len(want) == 0 {
		if _, _, err := h.store().Load(t.Context(), id); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("Load after a rejected first append: %v, want ErrNotFound", err)
		}
		return target
	}
	h.reopen()
	_, got := h.load(id)
	if d := diffEvents(want, got); d != "" {
		t.Fatalf("a rejected batch changed the log (-want +got):\n%s", d)
	}
	return target
}

func testWrongFirstSeq(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	b.CompletedTurn(1)
	evs := b.Events()
	if err := h.store().Create(t.Context(), Header("s")); err != nil {
		t.Fatal(err)
	}
	// The first batch of a lazy session must start at 0.
	e := rejected[*persistence.SeqError](t, h, "s", evs[1:3], nil)
	if e.Want != 0 || e.Got != 1 {
		t.Fatalf("SeqError = %+v, want Want 0 Got 1", e)
	}
	h.store() // rejected may not reopen on this path
	if err := h.store().Create(t.Context(), Header("s")); !errors.Is(err, persistence.ErrExists) {
		t.Fatalf("the rejected append lost the pending session: Create again = %v", err)
	}
	n := turnEnd(evs, 1) // a balanced prefix: loading it repairs nothing
	h.append("s", evs[:n])
	for _, first := range []int{n - 1, n + 1, 0} {
		e := rejected[*persistence.SeqError](t, h, "s", evs[first:first+2], evs[:n])
		if e.Index != 0 || e.Want != int64(n) || e.Got != int64(first) {
			t.Fatalf("SeqError = %+v, want Index 0 Want %d Got %d", e, n, first)
		}
	}
	if err := h.store().Append(t.Context(), "s", evs[n:]); err != nil {
		t.Fatalf("the right batch after rejections: %v", err)
	}
}

func testGapInBatch(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(2)
	b.CompletedTurn(2)
	evs := b.Events()
	n := turnEnd(evs, 1)
	h.created("g", &Builder{events: evs[:n]})
	gap := []*sessionv1.SessionEvent{evs[n], evs[n+1], evs[n+3]}
	e := rejected[*persistence.SeqError](t, h, "g", gap, evs[:n])
	if e.Index != 2 || e.Want != int64(n+2) || e.Got != int64(n+3) {
		t.Fatalf("SeqError = %+v, want Index 2 Want %d Got %d", e, n+2, n+3)
	}
	// A gap inside the first batch of a lazy session writes nothing either.
	if err := h.store().Create(t.Context(), Header("g2")); err != nil {
		t.Fatal(err)
	}
	rejected[*persistence.SeqError](t, h, "g2", []*sessionv1.SessionEvent{evs[0], evs[2]}, nil)
}

func testNonJSON(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	h.created("s", &b)
	stored := b.Events()
	bad := []struct {
		ev   *sessionv1.SessionEvent
		typ  string
		name string
	}{
		{func() *sessionv1.SessionEvent {
			ev := session.ContextMessageEvent([]*llmv1.ContentBlock{session.Text("x")}, session.UserSource())
			meta := "{not json"
			ev.GetContextMessage().Meta = &meta
			return ev
		}(), session.TypeContextMessage, "context meta"},
		{session.ExtensionEvent("example/asked", `{"id": 1,`), "example/asked", "extension json"},
		{func() *sessionv1.SessionEvent {
			ev := session.ContextMessageEvent([]*llmv1.ContentBlock{session.ExtensionBlock("audio", "NaN")}, session.UserSource())
			return ev
		}(), session.TypeContextMessage, "nested extension block"},
	}
	for _, c := range bad {
		ok := session.ContextMessageEvent([]*llmv1.ContentBlock{session.Text("fine")}, session.UserSource())
		ok.Seq, ok.Time = b.Len(), BaseTime
		c.ev.Seq, c.ev.Time = b.Len()+1, BaseTime
		e := rejected[*persistence.InvalidEventError](t, h, "s", []*sessionv1.SessionEvent{ok, c.ev}, stored)
		if e.Type != c.typ || e.Seq != b.Len()+1 {
			t.Errorf("%s: InvalidEventError = %+v, want Type %q Seq %d", c.name, e, c.typ, b.Len()+1)
		}
	}
}

func testDuplicateCreate(t *testing.T, h *harness) {
	s := h.store()
	if err := s.Create(t.Context(), Header("d")); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(t.Context(), Header("d")); !errors.Is(err, persistence.ErrExists) || persistence.Code(err) != persistence.CodeExists {
		t.Fatalf("second Create of a pending session: %v, want ErrExists", err)
	}
	var b Builder
	b.CompletedTurn(1)
	h.append("d", b.Events())
	if err := s.Create(t.Context(), Header("d")); !errors.Is(err, persistence.ErrExists) {
		t.Fatalf("Create of a stored session: %v, want ErrExists", err)
	}
	s = h.reopen()
	if err := s.Create(t.Context(), Header("d")); !errors.Is(err, persistence.ErrExists) {
		t.Fatalf("Create of a stored session after reopen: %v, want ErrExists", err)
	}
	_, got := h.load("d")
	if d := diffEvents(b.Events(), got); d != "" {
		t.Fatalf("duplicate create changed the log (-want +got):\n%s", d)
	}
}

func testUnknownVersion(t *testing.T, h *harness) {
	hd := Header("v")
	hd.Version = 1
	err := h.store().Create(t.Context(), hd)
	if !errors.Is(err, persistence.ErrUnknownVersion) || persistence.Code(err) != persistence.CodeUnknownVersion {
		t.Fatalf("Create(version 1): %v, want ErrUnknownVersion", err)
	}
	if err := h.store().Create(t.Context(), nil); !errors.Is(err, persistence.ErrInvalidHeader) {
		t.Fatalf("Create(nil): %v, want ErrInvalidHeader", err)
	}
	if err := h.store().Create(t.Context(), Header("")); !errors.Is(err, persistence.ErrInvalidHeader) {
		t.Fatalf("Create(empty id): %v, want ErrInvalidHeader", err)
	}
}

func testMissing(t *testing.T, h *harness) {
	s := h.store()
	if _, _, err := s.Load(t.Context(), "nope"); !errors.Is(err, persistence.ErrNotFound) || persistence.Code(err) != persistence.CodeNotFound {
		t.Fatalf("Load(missing): %v, want ErrNotFound", err)
	}
	var b Builder
	b.CompletedTurn(1)
	if err := s.Append(t.Context(), "nope", b.Events()); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("Append(missing): %v, want ErrNotFound", err)
	}
	if _, err := s.PublishedCursor(t.Context(), "nope"); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("PublishedCursor(missing): %v, want ErrNotFound", err)
	}
	if err := s.SetPublishedCursor(t.Context(), "nope", 0); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("SetPublishedCursor(missing): %v, want ErrNotFound", err)
	}
}

func testCallerMutation(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	want := make([]*sessionv1.SessionEvent, 0, b.Len())
	for _, ev := range b.Events() {
		want = append(want, proto.CloneOf(ev))
	}
	h.created("m", &b)
	for _, ev := range b.Events() {
		ev.Time = 1
		if um := ev.GetUserMessage(); um != nil {
			um.Content[0] = session.Text("mutated")
		}
	}
	_, got := h.load("m")
	if d := diffEvents(want, got); d != "" {
		t.Fatalf("mutation after Append leaked into the store (-want +got):\n%s", d)
	}
}

func testAppendAfterReopen(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	n := b.Len()
	b.StartTurn("more")
	b.StartStep()
	h.created("r", &Builder{events: b.Events()[:n]})
	h.reopen()
	h.append("r", b.Events()[n:])
	checkRepair(t, h, "r", b.Events())
}

func testAppendAfterRepair(t *testing.T, h *harness) {
	var b Builder
	b.StartTurn("go")
	b.StartStep()
	h.created("r", &b)
	_, got := h.load("r")
	// Continue the repaired log with a new turn.
	nb := Builder{events: append([]*sessionv1.SessionEvent(nil), got...), turn: 1}
	nb.CompletedTurn(1)
	h.append("r", nb.Events()[len(got):])
	h.reopen()
	_, all := h.load("r")
	if d := diffEvents(nb.Events(), all); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func testPublishedCursor(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	h.created("p", &b)
	s := h.store()
	ctx := t.Context()
	if n, err := s.PublishedCursor(ctx, "p"); err != nil || n != 0 {
		t.Fatalf("PublishedCursor = %d, %v; want 0", n, err)
	}
	if err := s.SetPublishedCursor(ctx, "p", 3); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPublishedCursor(ctx, "p", 2); err != nil {
		t.Fatalf("lowering is a no-op, got %v", err)
	}
	var ce *persistence.CursorError
	if err := s.SetPublishedCursor(ctx, "p", b.Len()+1); !errors.As(err, &ce) || ce.Len != b.Len() {
		t.Fatalf("cursor beyond the log: %v, want *CursorError with Len %d", err, b.Len())
	}
	if n, err := s.PublishedCursor(ctx, "p"); err != nil || n != 3 {
		t.Fatalf("PublishedCursor = %d, %v; want 3", n, err)
	}
	s = h.reopen()
	if n, err := s.PublishedCursor(ctx, "p"); err != nil || n != 3 {
		t.Fatalf("PublishedCursor after reopen = %d, %v; want 3", n, err)
	}
	if err := s.SetPublishedCursor(ctx, "p", b.Len()); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PublishedCursor(ctx, "p"); err != nil || n != b.Len() {
		t.Fatalf("PublishedCursor = %d, %v; want %d", n, err, b.Len())
	}
}

func testConcurrent(t *testing.T, h *harness) {
	s := h.store()
	const sessions, turns = 4, 5
	var wg sync.WaitGroup
	errs := make(chan error, sessions*turns*2)
	builders := make([]*Builder, sessions)
	for i := range sessions {
		id := fmt.Sprintf("c%d", i)
		b := &Builder{}
		builders[i] = b
		if err := s.Create(t.Context(), Header(id)); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range turns {
				from := b.Len()
				b.CompletedTurn(2)
				if err := s.Append(t.Context(), id, b.Events()[from:]); err != nil {
					errs <- err
					return
				}
				if _, _, err := s.Load(t.Context(), id); err != nil {
					errs <- err
				}
				if _, err := s.List(t.Context()); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, b := range builders {
		_, got := h.load(fmt.Sprintf("c%d", i))
		if d := diffEvents(b.Events(), got); d != "" {
			t.Fatalf("session %d (-want +got):\n%s", i, d)
		}
	}
}

// failingStore fails the next n appends before reaching the store.
type failingStore struct {
	persistence.Store
	mu   sync.Mutex
	fail int
}

func (f *failingStore) Append(ctx context.Context, id string, evs []*sessionv1.SessionEvent) error {
	f.mu.Lock()
	fail := f.fail > 0
	if fail {
		f.fail--
	}
	f.mu.Unlock()
	if fail {
		return errors.New("injected: disk full")
	}
	return f.Store.Append(ctx, id, evs)
}

func testBufferRetry(t *testing.T, h *harness) {
	fs := &failingStore{Store: h.store(), fail: 1}
	buf := persistence.NewBuffer(fs)
	if err := fs.Create(t.Context(), Header("b")); err != nil {
		t.Fatal(err)
	}
	var b Builder
	b.CompletedTurn(1)
	n := int(b.Len())
	buf.Add("b", b.Events()...)
	if err := buf.Flush(t.Context(), "b"); err == nil {
		t.Fatal("Flush succeeded through a failing store")
	}
	if got := buf.Pending("b"); got != n {
		t.Fatalf("Pending after a failed flush = %d, want %d", got, n)
	}
	b.CompletedTurn(1) // the in-memory log runs ahead
	buf.Add("b", b.Events()[n:]...)
	if err := buf.Flush(t.Context(), "b"); err != nil {
		t.Fatalf("retry Flush: %v", err)
	}
	if got := buf.Pending("b"); got != 0 {
		t.Fatalf("Pending after flush = %d", got)
	}
	// A batch whose prefix is already stored (a lost acknowledgement) is
	// trimmed, not rejected.
	m := b.Len()
	b.CompletedTurn(1)
	if err := fs.Append(t.Context(), "b", b.Events()[m:m+3]); err != nil {
		t.Fatal(err)
	}
	buf.Add("b", b.Events()[m:]...)
	if err := buf.Flush(t.Context(), "b"); err != nil {
		t.Fatalf("Flush over a stored prefix: %v", err)
	}
	h.reopen()
	_, got := h.load("b")
	if d := diffEvents(b.Events(), got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func testClosed(t *testing.T, h *harness) {
	var b Builder
	b.CompletedTurn(1)
	h.created("x", &b)
	s := h.store()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := s.Load(t.Context(), "x"); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("Load after Close: %v, want ErrClosed", err)
	}
	h.cur = nil
}

// turnEnd returns the length of the prefix of evs that ends with the
// turn/end of turn.
func turnEnd(evs []*sessionv1.SessionEvent, turn int32) int {
	for i, ev := range evs {
		if ev.GetTurnEnd().GetTurn() == turn && ev.GetTurnEnd() != nil {
			return i + 1
		}
	}
	panic("no such turn/end")
}

func testReader(t *testing.T, h *harness) {
	r, ok := h.store().(persistence.Reader)
	if !ok {
		t.Skip("the store does not implement persistence.Reader")
	}
	var b Builder
	b.CompletedTurn(1)
	b.StartTurn("open")
	h.created("rd", &b, 4)
	ctx := t.Context()
	hd, err := r.ReadHeader(ctx, "rd")
	if err != nil || hd.GetId() != "rd" {
		t.Fatalf("ReadHeader = %v, %v", hd, err)
	}
	for _, from := range []int64{0, 3, b.Len() - 1, b.Len(), b.Len() + 5} {
		got, err := r.ReadEvents(ctx, "rd", from)
		if err != nil {
			t.Fatalf("ReadEvents(%d): %v", from, err)
		}
		want := b.Events()[min(from, b.Len()):]
		if d := diffEvents(want, got); d != "" {
			t.Fatalf("ReadEvents(%d) (-want +got):\n%s", from, d)
		}
	}
	_, loaded := h.load("rd") // repairs
	got, err := r.ReadEvents(ctx, "rd", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffEvents(loaded, got); d != "" {
		t.Fatalf("ReadEvents after the repairing Load (-want +got):\n%s", d)
	}
	if _, err := r.ReadEvents(ctx, "missing", 0); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("ReadEvents(missing): %v, want ErrNotFound", err)
	}
	if _, err := r.ReadHeader(ctx, "missing"); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("ReadHeader(missing): %v, want ErrNotFound", err)
	}
}

func testDiscard(t *testing.T, h *harness) {
	d, ok := h.store().(persistence.Discarder)
	if !ok {
		t.Skip("the store does not implement persistence.Discarder")
	}
	ctx := t.Context()
	s := h.store()
	if err := s.Create(ctx, Header("lazy")); err != nil {
		t.Fatal(err)
	}
	if err := d.Discard(ctx, "lazy"); err != nil {
		t.Fatal(err)
	}
	var b Builder
	b.CompletedTurn(1)
	if err := s.Append(ctx, "lazy", b.Events()); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("Append after Discard: %v, want ErrNotFound", err)
	}
	if err := s.Create(ctx, Header("lazy")); err != nil {
		t.Fatalf("Create after Discard: %v", err)
	}
	// A stored session survives Discard and can be continued.
	h.created("kept", &b)
	if err := d.Discard(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	more := Continue(b.Events())
	more.CompletedTurn(1)
	h.append("kept", more.Events()[b.Len():])
	_, got := h.load("kept")
	if d := diffEvents(more.Events(), got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func listIDs(t *testing.T, s persistence.Store) []string {
	t.Helper()
	hs, err := s.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, h := range hs {
		ids = append(ids, h.GetId())
	}
	return ids
}

func typeNames(evs []*sessionv1.SessionEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, session.TypeName(ev))
	}
	return out
}
