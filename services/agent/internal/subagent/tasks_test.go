package subagent

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// fakeSessions is the agent service's side (the upstream of this package):
// children that run until released or cancelled.
type fakeSessions struct {
	mu      sync.Mutex
	release chan struct{}
	ended   []string
	notes   []string
}

type fakeChild struct {
	id      string
	release chan struct{}
}

func (c *fakeChild) ID() string { return c.id }

func (c *fakeChild) Wait(ctx context.Context) Outcome {
	select {
	case <-c.release:
		return Outcome{StopReason: "completed", Output: "answer of " + c.id}
	case <-ctx.Done():
		return Outcome{StopReason: "aborted", Error: "cancelled"}
	}
}

func (f *fakeSessions) Depth(string) (int32, error) { return 0, nil }
func (f *fakeSessions) ToolNames(string) []string   { return []string{"echo"} }
func (f *fakeSessions) Start(_ context.Context, req Request) (Child, error) {
	return &fakeChild{id: "child-of-" + req.ParentID + "-" + req.TaskID, release: f.release}, nil
}
func (f *fakeSessions) End(_ context.Context, _ Request, c Child, out Outcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = append(f.ended, c.ID()+":"+out.StopReason)
}
func (f *fakeSessions) Notify(id, text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notes = append(f.notes, id+": "+text)
}

func call(h *Host, session, name, args string) *toolsv1.ToolExecutionResult {
	return h.Execute(context.Background(), &toolsv1.ToolExecution{CallId: "c", Name: name, Arguments: args,
		Context: &toolsv1.ToolContext{SessionId: session, Turn: 1}})
}

func resultText(r *toolsv1.ToolExecutionResult) string {
	var b strings.Builder
	for _, c := range r.GetContent() {
		b.WriteString(c.GetText().GetText())
	}
	return b.String()
}

// Background tasks are fenced by their owner session: another session can
// neither read, list nor kill them, even knowing the id.
func TestTasksFencedByOwner(t *testing.T) {
	fs := &fakeSessions{release: make(chan struct{})}
	h := NewHost(fs, DefaultMaxDepth)
	r := call(h, "alice", ToolSpawn, `{"description":"bg","prompt":"p","run_in_background":true}`)
	if r.GetIsError() || !strings.Contains(resultText(r), `"task_id":"subagent-1"`) {
		t.Fatalf("start: %v", r)
	}
	for _, tc := range []struct{ tool, args string }{
		{ToolOutput, `{"task_id":"subagent-1"}`},
		{ToolKill, `{"task_id":"subagent-1"}`},
	} {
		if r := call(h, "mallory", tc.tool, tc.args); r.GetError().GetCode() != CodeTaskNotFound {
			t.Fatalf("mallory %s: %v, want %s", tc.tool, r, CodeTaskNotFound)
		}
	}
	if r := call(h, "mallory", ToolList, `{}`); resultText(r) != "No subagent tasks." {
		t.Fatalf("mallory lists %q", resultText(r))
	}
	if r := call(h, "alice", ToolOutput, `{"task_id":"subagent-1"}`); resultText(r) != "Task subagent-1 is running." {
		t.Fatalf("alice output while running: %q", resultText(r))
	}
	if r := call(h, "alice", ToolKill, `{"task_id":"subagent-1"}`); !strings.Contains(resultText(r), "Kill requested") {
		t.Fatalf("alice kill: %q", resultText(r))
	}
	r = call(h, "alice", ToolOutput, `{"task_id":"subagent-1","wait":true,"timeout_ms":20000}`)
	if r.GetError().GetCode() != CodeChildFailed || strings.Contains(resultText(r), "answer") {
		t.Fatalf("killed task output: %v (want an error without partial output)", r)
	}
	if got := resultText(call(h, "alice", ToolList, `{}`)); !strings.HasPrefix(got, "subagent-1\tkilled\t") {
		t.Fatalf("alice lists %q", got)
	}
	if r := call(h, "alice", ToolKill, `{"task_id":"subagent-1"}`); !strings.Contains(resultText(r), "already finished") {
		t.Fatalf("second kill: %q", resultText(r))
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.notes) != 0 {
		t.Fatalf("a killed task sent a notice: %v", fs.notes)
	}
}

// A finished task nobody waited on sends one completion notice; disposing
// the owner cancels what still runs and waits for it.
func TestTasksNoticeAndDispose(t *testing.T) {
	fs := &fakeSessions{release: make(chan struct{})}
	h := NewHost(fs, DefaultMaxDepth)
	call(h, "alice", ToolSpawn, `{"description":"one","prompt":"p","run_in_background":true}`)
	close(fs.release)
	for !strings.Contains(resultText(call(h, "alice", ToolList, `{}`)), "\tcompleted\t") {
		runtime.Gosched() // the run is finishing on its own goroutine
	}
	h.DisposeSession(context.Background(), "alice") // waits for its notice
	fs.mu.Lock()
	if len(fs.notes) != 1 || !strings.Contains(fs.notes[0], "alice: Background subagent task subagent-1 (one) finished: completed") {
		t.Fatalf("notices %q", fs.notes)
	}
	fs.mu.Unlock()
	fs2 := &fakeSessions{release: make(chan struct{})}
	h2 := NewHost(fs2, DefaultMaxDepth)
	call(h2, "bob", ToolSpawn, `{"description":"two","prompt":"p","run_in_background":true}`)
	h2.DisposeSession(context.Background(), "bob")
	fs2.mu.Lock()
	defer fs2.mu.Unlock()
	if len(fs2.ended) != 1 || fs2.ended[0] != "child-of-bob-subagent-1:aborted" {
		t.Fatalf("after disposal: ended %v", fs2.ended)
	}
}
