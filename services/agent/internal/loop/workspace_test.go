package loop_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// scriptedWorkspace answers one scripted context (or error) per turn; the
// last answer repeats.
type scriptedWorkspace struct {
	mu      sync.Mutex
	answers []any // *toolsv1.GetWorkspaceContextResponse or error
	n       int
}

func (w *scriptedWorkspace) Context(context.Context, string, string, []string) (*toolsv1.GetWorkspaceContextResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := w.answers[min(w.n, len(w.answers)-1)]
	w.n++
	if err, ok := a.(error); ok {
		return nil, err
	}
	return a.(*toolsv1.GetWorkspaceContextResponse), nil
}

func wsContext(version, rules, skill string) *toolsv1.GetWorkspaceContextResponse {
	return &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, Version: version,
		Instructions: []*toolsv1.InstructionFile{{Path: "/work/AGENTS.md", Content: rules}},
		Skills:       []*toolsv1.SkillSummary{{Name: skill, Description: "Skill " + skill + "."}}}
}

// TestWorkspaceFreshness: the context is read every turn; an unchanged
// version logs no header, a failed read keeps the last context, and a new
// version is a CHANGE header with the new instructions and catalog.
func TestWorkspaceFreshness(t *testing.T) {
	t.Parallel()
	ws := &scriptedWorkspace{answers: []any{
		wsContext("v1", "Rule one.", "alpha"),
		wsContext("v1", "Rule one.", "alpha"),
		errors.New("toolhost down"),
		wsContext("v2", "Rule two.", "beta"),
	}}
	h := newHarness(t, nil, func(_ *harness, c *loop.Config) { c.Workspace = ws })
	for i, want := range []struct {
		reason sessionv1.HeaderReason
		rules  string
		skill  string
	}{
		{sessionv1.HeaderReason_HEADER_REASON_INITIAL, "Rule one.", "alpha"},
		{0, "", ""}, // same version: no header
		{0, "", ""}, // failed read: the last context stands, no header
		{sessionv1.HeaderReason_HEADER_REASON_CHANGE, "Rule two.", "beta"},
	} {
		from := h.log.Len()
		h.gw.Script(fakes.Response{Chunks: fakes.Text("ok")})
		h.send("go")
		h.waitIdle()
		var headers []*sessionv1.RequestHeader
		for _, ev := range h.log.EventsFrom(from) {
			if rh := ev.GetRequestHeader(); rh != nil {
				headers = append(headers, rh)
			}
			if te := ev.GetTurnEnd(); te != nil && te.GetReason().GetCompleted() == nil {
				t.Fatalf("turn %d did not complete: %v", i+1, te)
			}
		}
		if want.reason == 0 {
			if len(headers) != 0 {
				t.Errorf("turn %d logged headers %v", i+1, headers)
			}
			continue
		}
		if len(headers) != 1 || headers[0].GetReason() != want.reason {
			t.Fatalf("turn %d headers %v, want one %v", i+1, headers, want.reason)
		}
		hd := headers[0].GetHeader()
		prefix := hd.GetMessagePrefix()
		if !strings.Contains(hd.GetSystem(), want.rules) || len(prefix) != 1 ||
			!strings.Contains(prefix[0].GetContent()[0].GetText().GetText(), "- "+want.skill+": Skill "+want.skill+".") {
			t.Errorf("turn %d header: system %q prefix %v", i+1, hd.GetSystem(), prefix)
		}
	}
	if len(h.violations) > 0 || len(h.errs) > 0 {
		t.Errorf("violations %v errors %v", h.violations, h.errs)
	}
}
