package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/proctest"
)

// startTask starts a background bash task in session s whose processes
// (a setsid'd grandchild and a plain child; the launcher's command line
// holds it too) carry marker, and waits until they run.
func (h *escapeHost) startTask(t *testing.T, s, marker string) {
	t.Helper()
	r := h.call(t, s, "workspace-write", false, "bash", map[string]any{"description": "background task", "run_in_background": true,
		"command": "setsid bash -c 'exec -a " + marker + " sleep 300' & exec -a " + marker + " sleep 300"})
	if !strings.Contains(r.text, "started background task") {
		t.Fatalf("background task in %s did not start:\n%s", s, r.text)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(proctest.Living(marker)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("background task in %s: %v running, want 2 processes", s, proctest.Living(marker))
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not synchronising on time
	}
}

func killAll(marker string) {
	for _, p := range proctest.Living(marker) {
		syscall.Kill(p, syscall.SIGKILL)
	}
}

// TestBackgroundTasksDieWithTheirSession runs the real binary: EndSession
// kills the session's background tasks with their whole process trees
// (setsid included) and no other session's; shutdown kills the rest.
func TestBackgroundTasksDieWithTheirSession(t *testing.T) {
	h := startEscapeHost(t)
	stamp := time.Now().UnixNano()
	ma, mb := fmt.Sprintf("dsh-bg-a-%d", stamp), fmt.Sprintf("dsh-bg-b-%d", stamp)
	t.Cleanup(func() { killAll(ma); killAll(mb) })
	h.startTask(t, "a", ma)
	h.startTask(t, "b", mb)

	r, err := h.c.EndSession(t.Context(), &toolsv1.EndSessionRequest{SessionId: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetTasksStopped() != 1 {
		t.Errorf("tasks_stopped = %d, want 1", r.GetTasksStopped())
	}
	if pids := proctest.Living(ma); len(pids) > 0 {
		t.Errorf("session a's task left %v running after EndSession", pids)
	}
	if pids := proctest.Living(mb); len(pids) < 2 {
		t.Errorf("session b's task: %v running after a ended, want its processes alive", pids)
	}
	// Ending it again, or a session the host never saw, is a no-op.
	for _, id := range []string{"a", "never-seen"} {
		if r, err := h.c.EndSession(t.Context(), &toolsv1.EndSessionRequest{SessionId: id}); err != nil || r.GetTasksStopped() != 0 {
			t.Errorf("EndSession(%s) again = %v, %v; want 0 stopped", id, r, err)
		}
	}
	// Session a's task is forgotten: task_list no longer shows it.
	if lr := h.call(t, "a", "workspace-write", false, "task_list", map[string]any{}); strings.Contains(lr.text, "bash-1") {
		t.Errorf("task_list of ended session a still lists its task:\n%s", lr.text)
	}

	h.stop()
	if pids := proctest.Living(mb); len(pids) > 0 {
		t.Errorf("session b's task left %v running after the toolhost shut down", pids)
	}
}
