// Package bash holds the built-in bash tool and its background-task tools
// (task_output, task_list, task_kill), on a local executor that runs every
// call as a fresh `bash -c` in its own process group.
//
// A foreground call is killed with its whole group when it passes its
// timeout (default 2 min, at most 10 min) or when the call is cancelled;
// nothing it started survives the kill. Output is tail-capped per stream
// with the full stream spilled to a private file whose path the result
// names. Credential-looking environment variables never reach the shell.
// A background call (run_in_background) has no timeout, survives the call,
// and is read and stopped with the task tools by the session that started it.
package bash

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox"
)

// Shell is the bash tool family.
type Shell struct {
	x     *Executor
	tasks *Tasks
	// Resolve gives a call's confinement; nil runs every call with the
	// zero Effective (only meaningful without a Sandbox).
	Resolve func(*toolsdk.Call) (sandbox.Effective, error)
}

// New returns the tool family over an executor and a task registry.
func New(x *Executor, tasks *Tasks) *Shell { return &Shell{x: x, tasks: tasks} }

// Tools returns bash, task_output, task_list and task_kill.
func (s *Shell) Tools() []toolsdk.Tool {
	return []toolsdk.Tool{s.bashTool(), s.taskOutputTool(), s.taskListTool(), s.taskKillTool()}
}

// Args are the bash tool's parameters (names as the original's catalogue).
type Args struct {
	Command         string `json:"command" jsonschema:"required,description=The command to run with bash -c. Each call is a fresh shell: use workdir instead of cd."`
	Description     string `json:"description" jsonschema:"required,description=A 5-10 word active-voice summary of what the command does, shown in the UI."`
	TimeoutMs       int64  `json:"timeoutMs" jsonschema:"description=Time limit in milliseconds (default 120000, maximum 600000)."`
	Workdir         string `json:"workdir" jsonschema:"description=Working directory, absolute or relative to the session's working directory."`
	RunInBackground bool   `json:"run_in_background" jsonschema:"description=Start the command as a background task and return its id at once; read it with task_output and stop it with task_kill. No timeout applies."`
}

type bashMeta struct {
	Sandbox     *sandboxMeta `json:"sandbox,omitempty"`
	ExitCode    *int         `json:"exit_code,omitempty"`
	Signal      string       `json:"signal,omitempty"`
	TimedOut    bool         `json:"timed_out,omitempty"`
	SpillPaths  []string     `json:"spill_paths,omitempty"`
	TaskID      string       `json:"task_id,omitempty"`
	Description string       `json:"description,omitempty"`
}

func (s *Shell) bashTool() toolsdk.Tool {
	grace := s.x.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	return toolsdk.Define("bash",
		"Run a shell command with bash -c in a fresh, non-interactive shell (no state carries between calls). "+
			"The result is the stdout tail, a [stderr] section when stderr is not empty, and markers: "+
			"[output truncated; full output: <path>], [timed out after <ms>ms], [killed by signal: <sig>], [exit code: <n>]. "+
			"Always check the exit-code marker: a non-zero exit is reported, not raised as an error.",
		s.bash,
		toolsdk.Timeout(MaxTimeout+3*grace),
		toolsdk.PresentCall(func(a Args) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Terminal{Terminal: &toolsv1.TerminalCallView{
				Title: a.Command, Description: a.Description, Cwd: a.Workdir,
			}}}
		}),
		toolsdk.PresentResult(func(a Args, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			var m bashMeta
			if r.Meta == nil || jsonUnmarshal(r.GetMeta(), &m) != nil {
				return nil
			}
			v := &toolsv1.TerminalResultView{Output: toolsdk.ResultText(r.GetContent()), Signal: m.Signal}
			if m.ExitCode != nil {
				c := int32(*m.ExitCode)
				v.ExitCode = &c
			}
			if m.TaskID != "" {
				v.Title = "background task " + m.TaskID
			}
			return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Terminal{Terminal: v}}
		}),
	)
}

// sandboxMeta is how a call was confined, for programs and tests.
type sandboxMeta struct {
	Mode        string `json:"mode"`
	Network     bool   `json:"network"`
	Enforcement string `json:"enforcement"`
	Containment string `json:"containment,omitempty"`
	Denied      bool   `json:"denied,omitempty"`
}

func (s *Shell) spec(call *toolsdk.Call, a Args) (Spec, error) {
	dir := call.Cwd
	if a.Workdir != "" {
		dir = a.Workdir
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(call.Cwd, dir)
		}
	}
	spec := Spec{
		Command: a.Command, Dir: filepath.Clean(dir),
		Env:       []string{"DSH_SHELL=1", "DSH_SESSION_ID=" + call.SessionID},
		SessionID: call.SessionID, CallID: call.ID,
	}
	if s.Resolve != nil {
		eff, err := s.Resolve(call)
		if err != nil {
			return Spec{}, err
		}
		spec.Policy, spec.Root, spec.SpillDir = eff.Policy, eff.Root, eff.SpillDir
	}
	return spec, nil
}

func (s *Shell) bash(ctx context.Context, call *toolsdk.Call, a Args) (toolsdk.Result, error) {
	spec, err := s.spec(call, a)
	if err != nil {
		return toolsdk.Result{}, err
	}
	if a.RunInBackground {
		p, err := s.x.Start(spec)
		if err != nil {
			return toolsdk.Result{}, spawnError(err)
		}
		label := a.Description
		if label == "" {
			label = a.Command
		}
		t := s.tasks.Add(call.SessionID, label, p)
		res := toolsdk.Text("started background task " + t.ID)
		res.Meta = bashMeta{TaskID: t.ID, Description: a.Description}
		return res, nil
	}
	timeout := time.Duration(a.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	timeout = min(timeout, MaxTimeout)
	spec.OnOutput = call.Output
	r, err := s.x.Run(ctx, spec, timeout)
	if errors.Is(err, sandbox.ErrUnavailable) {
		return toolsdk.Result{}, unavailable(err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return toolsdk.Result{}, ctx.Err()
		}
		return toolsdk.Result{}, spawnError(err)
	}
	if r.Aborted {
		return toolsdk.Result{}, ctx.Err()
	}
	var b strings.Builder
	writeStreams(&b, r.Stdout.Text, r.Stderr.Text, "(no output)")
	var spills []string
	for _, o := range []Output{r.Stdout, r.Stderr} {
		if o.Truncated {
			path := o.SpillPath
			if path == "" {
				path = "(unavailable)"
			} else {
				spills = append(spills, path)
			}
			fmt.Fprintf(&b, "\n[output truncated; full output: %s]", path)
			if o.SpillCapped {
				fmt.Fprintf(&b, "\n[the file holds the first %d bytes only]", s.x.maxSpill())
			}
		}
	}
	var sm *sandboxMeta
	if r.Containment != "" {
		sm = &sandboxMeta{Mode: string(spec.Policy.Mode), Network: spec.Policy.Network, Enforcement: enforcementName(r.Enforcement), Containment: r.Containment}
		sm.Denied = s.markers(&b, spec.Policy, r)
	}
	if len(spills) > 0 {
		b.WriteString("\n[read the full output with the read tool (offset and limit page through it) or grep it by path]")
	}
	if r.TimedOut {
		fmt.Fprintf(&b, "\n[timed out after %dms]", r.Timeout.Milliseconds())
	}
	if r.Signal != "" {
		fmt.Fprintf(&b, "\n[killed by signal: %s]", r.Signal)
	}
	if r.Code != nil {
		fmt.Fprintf(&b, "\n[exit code: %d]", *r.Code)
	}
	res := toolsdk.Text(b.String())
	res.Meta = bashMeta{ExitCode: r.Code, Signal: r.Signal, TimedOut: r.TimedOut, SpillPaths: spills, Description: a.Description, Sandbox: sm}
	res.Enforcement = r.Enforcement
	return res, nil
}

// writeStreams renders stdout, then a [stderr] section, or empty.
func writeStreams(b *strings.Builder, stdout, stderr, empty string) {
	stdout = strings.TrimRight(stdout, "\n")
	stderr = strings.TrimRight(stderr, "\n")
	b.WriteString(stdout)
	if stderr != "" {
		if stdout != "" {
			b.WriteByte('\n')
		}
		b.WriteString("[stderr]\n")
		b.WriteString(stderr)
	}
	if stdout == "" && stderr == "" {
		b.WriteString(empty)
	}
}

func unavailable(err error) error {
	return toolsdk.NewError("SandboxError", "SANDBOX_UNAVAILABLE",
		"the command was not run: its sandbox cannot be enforced on this host ("+strings.TrimPrefix(err.Error(), sandbox.ErrUnavailable.Error()+": ")+")", err)
}

func spawnError(err error) error {
	if errors.Is(err, sandbox.ErrUnavailable) {
		return unavailable(err)
	}
	msg := err.Error()
	if errors.Is(err, ErrStart) {
		msg = strings.TrimPrefix(msg, ErrStart.Error()+": ")
	}
	return toolsdk.NewError("BashError", "BASH_SPAWN_FAILED", "could not start the command: "+msg, err)
}

// TaskOutputArgs are task_output's parameters.
type TaskOutputArgs struct {
	TaskID    string `json:"task_id" jsonschema:"required,description=The background task id (bash-N)."`
	Wait      bool   `json:"wait" jsonschema:"description=Wait for the task to finish (bounded by timeout_ms) before returning."`
	TimeoutMs int64  `json:"timeout_ms" jsonschema:"description=How long to wait in milliseconds (default 30000, maximum 600000); the task keeps running when it passes."`
}

func (s *Shell) taskOutputTool() toolsdk.Tool {
	return toolsdk.Define("task_output",
		"Read a background task's new output since the last read. The response ends with [status: ...]. With wait, blocks until the task finishes or timeout_ms passes (the task keeps running).",
		s.taskOutput,
		toolsdk.Timeout(MaxTimeout+time.Minute),
		toolsdk.AlwaysConcurrencySafe(),
		toolsdk.PresentCall(func(a TaskOutputArgs) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{
				Title: "Read output of " + a.TaskID, Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_READ, RawInput: a.TaskID,
			}}}
		}),
	)
}

func taskNotFound(id string) error {
	return toolsdk.NewError("TaskError", "TASK_NOT_FOUND", fmt.Sprintf("no background task %q in this session; task_list shows yours", id), nil)
}

func (s *Shell) taskOutput(ctx context.Context, call *toolsdk.Call, a TaskOutputArgs) (toolsdk.Result, error) {
	t, ok := s.tasks.Get(call.SessionID, a.TaskID)
	if !ok {
		return toolsdk.Result{}, taskNotFound(a.TaskID)
	}
	if a.Wait {
		d := time.Duration(a.TimeoutMs) * time.Millisecond
		if d <= 0 {
			d = 30 * time.Second
		}
		timer := time.NewTimer(min(d, MaxTimeout))
		select {
		case <-t.Done():
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return toolsdk.Result{}, ctx.Err()
		}
		timer.Stop()
	}
	stdout, stderr, lossy := t.Read()
	var b strings.Builder
	writeStreams(&b, stdout, stderr, "(no new output)")
	if lossy {
		fmt.Fprintf(&b, "\n[output truncated: older output was dropped; full output: %s]", orUnavailable(strings.Join(t.SpillPaths(), ", ")))
	}
	fmt.Fprintf(&b, "\n[status: %s]", statusLine(t))
	return toolsdk.Text(b.String()), nil
}

func orUnavailable(s string) string {
	if s == "" {
		return "(unavailable)"
	}
	return s
}

func statusLine(t *Task) string {
	st := t.Status()
	switch st {
	case TaskRunning, TaskStopping:
		return string(st)
	}
	ex := t.proc.Exit()
	if ex.Code != nil {
		return fmt.Sprintf("%s (exit code %d)", st, *ex.Code)
	}
	return fmt.Sprintf("%s (signal %s)", st, ex.Signal)
}

func (s *Shell) taskListTool() toolsdk.Tool {
	return toolsdk.Define("task_list", "List this session's background tasks with their ids, kinds and statuses.",
		func(_ context.Context, call *toolsdk.Call, _ struct{}) (toolsdk.Result, error) {
			ts := s.tasks.List(call.SessionID)
			if len(ts) == 0 {
				return toolsdk.Text("No background tasks."), nil
			}
			var b strings.Builder
			for i, t := range ts {
				if i > 0 {
					b.WriteByte('\n')
				}
				fmt.Fprintf(&b, "%s\tbash\t%s\t%s", t.ID, statusLine(t), t.Label)
			}
			return toolsdk.Text(b.String()), nil
		}, toolsdk.AlwaysConcurrencySafe())
}

// TaskKillArgs are task_kill's parameters.
type TaskKillArgs struct {
	TaskID string `json:"task_id" jsonschema:"required,description=The background task id (bash-N)."`
	Reason string `json:"reason" jsonschema:"description=Why the task is being stopped."`
}

func (s *Shell) taskKillTool() toolsdk.Tool {
	return toolsdk.Define("task_kill", "Request cancellation of a background task (its whole process group). Returns at once.",
		func(_ context.Context, call *toolsdk.Call, a TaskKillArgs) (toolsdk.Result, error) {
			t, ok := s.tasks.Get(call.SessionID, a.TaskID)
			if !ok {
				return toolsdk.Result{}, taskNotFound(a.TaskID)
			}
			if !t.Kill() {
				return toolsdk.Text(fmt.Sprintf("Task %s already finished: %s.", t.ID, statusLine(t))), nil
			}
			return toolsdk.Text(fmt.Sprintf("Kill requested for task %s.", t.ID)), nil
		})
}
