package bash

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// TaskStatus is a background task's state.
type TaskStatus string

// Task states.
const (
	TaskRunning   TaskStatus = "running"
	TaskStopping  TaskStatus = "stopping"
	TaskCompleted TaskStatus = "completed"
	TaskKilled    TaskStatus = "killed"
	TaskFailed    TaskStatus = "failed"
)

// Task is one background command. Its output is read by consuming deltas.
type Task struct {
	ID, Label, Owner string
	Started          time.Time
	proc             *Process

	mu       sync.Mutex
	killed   bool
	finished time.Time
	outPos   int64
	errPos   int64
}

// Status is the task's current state.
func (t *Task) Status() TaskStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.proc.Done():
	default:
		if t.killed {
			return TaskStopping
		}
		return TaskRunning
	}
	switch ex := t.proc.Exit(); {
	case t.killed:
		return TaskKilled
	case ex.Code != nil && *ex.Code == 0:
		return TaskCompleted
	default:
		return TaskFailed
	}
}

// Tasks is the registry of background tasks, fenced by owner session.
type Tasks struct {
	mu  sync.Mutex
	seq int
	m   map[string]*Task
	now func() time.Time
}

// NewTasks returns an empty registry; now stamps start times.
func NewTasks(now func() time.Time) *Tasks {
	if now == nil {
		now = time.Now
	}
	return &Tasks{m: map[string]*Task{}, now: now}
}

// Add registers a started process and returns its id ("bash-N").
func (r *Tasks) Add(owner, label string, p *Process) *Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	t := &Task{ID: fmt.Sprintf("bash-%d", r.seq), Label: label, Owner: owner, Started: r.now(), proc: p}
	r.m[t.ID] = t
	return t
}

// Get returns owner's task id.
func (r *Tasks) Get(owner, id string) (*Task, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.m[id]
	if !ok || t.Owner != owner {
		return nil, false
	}
	return t, true
}

// List returns owner's tasks in start order.
func (r *Tasks) List(owner string) []*Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Task
	for _, t := range r.m {
		if t.Owner == owner {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *Task) int { return idNum(a.ID) - idNum(b.ID) })
	return out
}

func idNum(id string) int {
	var n int
	fmt.Sscanf(id, "bash-%d", &n)
	return n
}

// Kill requests cancellation; false when the task had already finished.
func (t *Task) Kill() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.proc.Kill() {
		t.killed = true
		return true
	}
	return false
}

// Done is closed when the task finished.
func (t *Task) Done() <-chan struct{} { return t.proc.Done() }

// Read consumes the output written since the last read.
func (t *Task) Read() (stdout, stderr string, lossy bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var l1, l2 bool
	stdout, l1, t.outPos = t.proc.stdout.since(t.outPos)
	stderr, l2, t.errPos = t.proc.stderr.since(t.errPos)
	return stdout, stderr, l1 || l2
}

// SpillPaths are the files holding the task's full streams, if spilled.
func (t *Task) SpillPaths() []string {
	var out []string
	for _, c := range []*capture{t.proc.stdout, t.proc.stderr} {
		if p := c.spillPath(); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Close kills every task and waits for them.
func (r *Tasks) Close() { r.stop(func(*Task) bool { return true }) }

// EndSession kills owner's tasks with their whole process trees, waits
// until they are gone and forgets them; it returns how many were still
// running. Other sessions' tasks are untouched.
func (r *Tasks) EndSession(owner string) int {
	return r.stop(func(t *Task) bool { return t.Owner == owner })
}

// stop kills and removes the tasks match selects, waits for them, and
// returns how many had not finished.
func (r *Tasks) stop(match func(*Task) bool) int {
	r.mu.Lock()
	var ts []*Task
	for id, t := range r.m {
		if match(t) {
			ts = append(ts, t)
			delete(r.m, id)
		}
	}
	r.mu.Unlock()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		running int
	)
	for _, t := range ts {
		wg.Go(func() {
			if t.Kill() {
				mu.Lock()
				running++
				mu.Unlock()
			}
			t.proc.KillWait()
		})
	}
	wg.Wait()
	return running
}
