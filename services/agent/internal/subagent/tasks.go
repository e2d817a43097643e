package subagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Task statuses (semantics.md §7.21).
const (
	statusRunning   = "running"
	statusStopping  = "stopping"
	statusCompleted = "completed"
	statusKilled    = "killed"
	statusFailed    = "failed"
)

// task is one background subagent run, owned by its parent session.
type task struct {
	id, label, child string
	cancel           context.CancelFunc
	done             chan struct{}
	status           string // guarded by tasks.mu
	result           *toolsv1.ToolExecutionResult
	reported         bool
	waiting          int // subagent_output calls waiting on it
}

type ownerTasks struct {
	next int
	list []*task
	wg   sync.WaitGroup
}

// tasks is the registry of background runs, fenced by owner session.
type tasks struct {
	mu      sync.Mutex
	byOwner map[string]*ownerTasks
}

func (ts *tasks) owner(id string) *ownerTasks {
	o := ts.byOwner[id]
	if o == nil {
		o = &ownerTasks{}
		ts.byOwner[id] = o
	}
	return o
}

func (ts *tasks) find(owner, id string) *task {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if o := ts.byOwner[owner]; o != nil {
		for _, t := range o.list {
			if t.id == id {
				return t
			}
		}
	}
	return nil
}

// background starts req's child as a task and returns at once.
func (h *Host) background(ctx context.Context, req Request) *toolsv1.ToolExecutionResult {
	h.tasks.mu.Lock()
	o := h.tasks.owner(req.ParentID)
	o.next++
	req.TaskID = fmt.Sprintf("subagent-%d", o.next)
	h.tasks.mu.Unlock()
	child, err := h.Sessions.Start(ctx, req)
	if err != nil {
		return errorResult("could not start the subagent: "+err.Error(), CodeStartFailed)
	}
	// The run belongs to the parent session, not to this call.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &task{id: req.TaskID, label: req.Description, child: child.ID(), cancel: cancel, done: make(chan struct{}), status: statusRunning}
	h.tasks.mu.Lock()
	o.list = append(o.list, t)
	o.wg.Add(1)
	h.tasks.mu.Unlock()
	go func() {
		defer o.wg.Done()
		defer cancel()
		out := child.Wait(runCtx)
		h.Sessions.End(context.WithoutCancel(runCtx), req, child, out)
		h.tasks.mu.Lock()
		switch {
		case t.status == statusStopping:
			t.status = statusKilled
		case out.StopReason == "completed":
			t.status = statusCompleted
		default:
			t.status = statusFailed
		}
		t.result = resultOf(child.ID(), req, out)
		// A reader waiting on it now delivers the result: no notice.
		t.reported = t.reported || t.waiting > 0
		st, reported := t.status, t.reported
		h.tasks.mu.Unlock()
		close(t.done)
		if !reported && st != statusKilled {
			h.Sessions.Notify(req.ParentID, fmt.Sprintf("Background subagent task %s (%s) finished: %s. Read it with %s.",
				t.id, t.label, st, ToolOutput))
		}
	}()
	b, _ := json.Marshal(map[string]string{"task_id": t.id, "session_id": child.ID(), "status": statusRunning})
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(string(b))}}
}

// taskTool serves subagent_output, subagent_list and subagent_kill.
func (h *Host) taskTool(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
	owner := ex.GetContext().GetSessionId()
	if ex.GetName() == ToolList {
		h.tasks.mu.Lock()
		defer h.tasks.mu.Unlock()
		var lines []string
		if o := h.tasks.byOwner[owner]; o != nil {
			for _, t := range o.list {
				lines = append(lines, strings.Join([]string{t.id, t.status, t.child, t.label}, "\t"))
			}
		}
		if len(lines) == 0 {
			return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("No subagent tasks.")}}
		}
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(strings.Join(lines, "\n"))}}
	}
	var in struct {
		TaskID    string `json:"task_id"`
		Wait      bool   `json:"wait"`
		TimeoutMs int64  `json:"timeout_ms"`
	}
	if err := json.Unmarshal([]byte(ex.GetArguments()), &in); err != nil || in.TaskID == "" {
		return errorResult(`arguments must be {"task_id":"subagent-N"}`, CodeInvalidArgs)
	}
	t := h.tasks.find(owner, in.TaskID)
	if t == nil {
		return errorResult(fmt.Sprintf("no subagent task %q in this session (see %s)", in.TaskID, ToolList), CodeTaskNotFound)
	}
	if ex.GetName() == ToolKill {
		h.tasks.mu.Lock()
		running := t.status == statusRunning
		if running {
			t.status = statusStopping
		}
		h.tasks.mu.Unlock()
		if !running {
			return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("Task " + t.id + " already finished.")}}
		}
		t.cancel()
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("Kill requested for task " + t.id + ".")}}
	}
	if in.Wait {
		timeout := time.Duration(in.TimeoutMs) * time.Millisecond
		if timeout <= 0 {
			timeout = 30 * time.Second
		}
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		h.tasks.mu.Lock()
		t.waiting++
		h.tasks.mu.Unlock()
		select {
		case <-t.done:
		case <-timer.C:
		case <-ctx.Done():
		}
		h.tasks.mu.Lock()
		t.waiting--
		h.tasks.mu.Unlock()
	}
	h.tasks.mu.Lock()
	defer h.tasks.mu.Unlock()
	if t.result == nil {
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(fmt.Sprintf("Task %s is %s.", t.id, t.status))}}
	}
	t.reported = true
	r := t.result
	return &toolsv1.ToolExecutionResult{Content: r.GetContent(), IsError: r.GetIsError(), Error: r.GetError()}
}

// DisposeSession cancels a session's background tasks and waits for them
// (agent disposal cancels and awaits its tasks, §7.21).
func (h *Host) DisposeSession(ctx context.Context, sessionID string) {
	h.tasks.mu.Lock()
	o := h.tasks.byOwner[sessionID]
	delete(h.tasks.byOwner, sessionID)
	h.tasks.mu.Unlock()
	if o == nil {
		return
	}
	for _, t := range o.list {
		t.cancel()
	}
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
