// Package subagent serves delegation (semantics.md §7.7, design round2.md
// §5): the agent-side tools subagent (provider spawn: a fresh child) and
// subagent_fork (provider fork: a child seeded with the parent's prefix up to
// and including its last turn/end), and the task tools of background runs
// (subagent_output, subagent_list, subagent_kill; §7.21).
//
// A child is an ordinary session of the same agent service (Sessions, served
// by the service): same tenant, parent_session and delegation_depth in its
// header, its own log, streams and NATS subjects. This package owns the
// tools' contract: argument and capability checks (an unsupported capability
// is UNSUPPORTED_CAPABILITY, never ignored), the depth limit, foreground and
// background runs, and the results the model sees.
//
// The task tools have their own names because the toolhost serves task_output,
// task_list and task_kill for its bash tasks (bash-N) and a tool name has one
// owning host; subagent tasks are subagent-N.
package subagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Tool names.
const (
	ToolSpawn  = "subagent"
	ToolFork   = "subagent_fork"
	ToolOutput = "subagent_output"
	ToolList   = "subagent_list"
	ToolKill   = "subagent_kill"
	// CaptureTool is the forced capture tool a child with an output schema
	// gets: its parameters are the schema verbatim (§6.8).
	CaptureTool = "structured_output"
)

// Error codes of the tools' error results.
const (
	CodeUnsupported  = "UNSUPPORTED_CAPABILITY"
	CodeInvalidArgs  = "INVALID_ARGUMENTS"
	CodeDepthLimit   = "DEPTH_LIMIT"
	CodeUnknownTool  = "UNKNOWN_TOOL"
	CodeInvalidSchem = "INVALID_OUTPUT_SCHEMA"
	CodeStartFailed  = "SUBAGENT_START_FAILED"
	CodeChildFailed  = "SUBAGENT_FAILED"
	CodeTaskNotFound = "TASK_NOT_FOUND"
)

// DefaultMaxDepth is the default delegation depth limit.
const DefaultMaxDepth = 3

// Request is a validated delegation.
type Request struct {
	ParentID    string
	ToolCallID  string
	Turn        int32
	Mode        sessionv1.SubagentMode
	Description string
	Prompt      string
	// Tools is the child's tool allow-list (empty: all the parent sees).
	Tools        []string
	Persona      string
	OutputSchema string
	Background   bool
	TaskID       string
	// Depth is the child's delegation depth.
	Depth int32
}

// Outcome is how a child's run ended (§7.7 SubagentResult).
type Outcome struct {
	// StopReason is completed, aborted, error, max-tokens, refusal,
	// disposed, interrupted or rejected.
	StopReason string
	// Output is the text of the child's last assistant message.
	Output string
	// Structured is the captured value, only when the schema was satisfied.
	Structured json.RawMessage
	// Error describes a run that did not complete.
	Error string
	Usage *llmv1.TokenUsage
}

// Child is a started child session.
type Child interface {
	ID() string
	// Wait awaits the child's turn; when ctx ends first the child's turn
	// is cancelled and Wait returns once it has ended.
	Wait(ctx context.Context) Outcome
}

// Sessions is the agent service's side of delegation.
type Sessions interface {
	// Depth is the durable delegation depth of a live session.
	Depth(sessionID string) (int32, error)
	// ToolNames lists the tools the session sees.
	ToolNames(sessionID string) []string
	// Start creates the child, logs subagent/start in the parent's open
	// turn and queues the prompt.
	Start(ctx context.Context, req Request) (Child, error)
	// End logs subagent/end in the parent and disposes the child.
	End(ctx context.Context, req Request, child Child, out Outcome)
	// Notify injects a background completion notice into the parent.
	Notify(sessionID, text string)
}

// Host serves the delegation tools (a part of the agent-side toolhost).
type Host struct {
	Sessions Sessions
	// MaxDepth is the deepest child allowed; 0 forbids delegation.
	MaxDepth int32
	tasks    tasks
}

// NewHost returns a host.
func NewHost(s Sessions, maxDepth int32) *Host {
	return &Host{Sessions: s, MaxDepth: maxDepth, tasks: tasks{byOwner: map[string]*ownerTasks{}}}
}

const spawnDescription = "Delegate a self-contained task to a subagent: a fresh child agent that does not see this " +
	"conversation, so the prompt must say everything it needs. Returns the child's final answer. Use it for " +
	"independent research or work that would clutter this context. To run several children at once, start them " +
	"with run_in_background and read each result with subagent_output (wait: true)."

const forkDescription = "Delegate a task to a forked subagent: a child that starts from this conversation as it " +
	"stood at the end of the previous turn, so it knows the context without repeating it. Returns the child's " +
	"final answer. Set run_in_background to get a task id at once and read the result later with subagent_output."

func delegateParameters(persona bool) string {
	p := `{"type":"object","properties":{` +
		`"description":{"type":"string","description":"A short (3-5 word) description of the task."},` +
		`"prompt":{"type":"string","description":"The task for the subagent."},` +
		`"run_in_background":{"type":"boolean","description":"Return a task id at once instead of waiting."},` +
		`"tools":{"type":"array","items":{"type":"string"},"description":"Restrict the child to these tools."},` +
		`"output_schema":{"type":"object","description":"JSON schema (object-rooted subset) the child's result must satisfy."}`
	if persona {
		p += `,"persona":{"type":"string","description":"Who the child is (replaces the default identity)."}`
	}
	return p + `},"required":["description","prompt"]}`
}

const taskIDParam = `"task_id":{"type":"string","description":"The subagent task id (subagent-N)."}`

// Tools lists the delegation tools.
func (h *Host) Tools() []*toolsv1.ToolDescriptor {
	d := func(name, desc, params string) *toolsv1.ToolDescriptor {
		return &toolsv1.ToolDescriptor{Schema: &llmv1.ToolSchema{Name: name, Description: desc, Parameters: params}}
	}
	return []*toolsv1.ToolDescriptor{
		d(ToolSpawn, spawnDescription, delegateParameters(true)),
		d(ToolFork, forkDescription, delegateParameters(false)),
		d(ToolOutput, "Read the result of a background subagent task; with wait, block until it finishes or timeout_ms passes.",
			`{"type":"object","properties":{`+taskIDParam+`,"wait":{"type":"boolean"},"timeout_ms":{"type":"integer"}},"required":["task_id"]}`),
		d(ToolList, "List this session's background subagent tasks (id, status, description).", `{"type":"object","properties":{}}`),
		d(ToolKill, "Stop a background subagent task.", `{"type":"object","properties":{`+taskIDParam+`},"required":["task_id"]}`),
	}
}

// Owns reports whether name is one of the host's tools.
func (h *Host) Owns(name string) bool {
	switch name {
	case ToolSpawn, ToolFork, ToolOutput, ToolList, ToolKill:
		return true
	}
	return false
}

// Execute runs one call.
func (h *Host) Execute(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
	switch ex.GetName() {
	case ToolSpawn:
		return h.delegate(ctx, ex, sessionv1.SubagentMode_SUBAGENT_MODE_SPAWN)
	case ToolFork:
		return h.delegate(ctx, ex, sessionv1.SubagentMode_SUBAGENT_MODE_FORK)
	case ToolOutput, ToolList, ToolKill:
		return h.taskTool(ctx, ex)
	}
	return errorResult("unknown tool: "+ex.GetName(), CodeUnknownTool)
}

// capabilities are the start-time flags each provider supports (§7.7): a
// fork continues the parent's conversation under the parent's identity, so
// it cannot take a persona.
var capabilities = map[sessionv1.SubagentMode][]string{
	sessionv1.SubagentMode_SUBAGENT_MODE_SPAWN: {"tools", "output_schema", "persona"},
	sessionv1.SubagentMode_SUBAGENT_MODE_FORK:  {"tools", "output_schema"},
}

// parse reads and checks a delegation call's arguments.
func (h *Host) parse(ex *toolsv1.ToolExecution, mode sessionv1.SubagentMode) (Request, string, string) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(ex.GetArguments()), &raw); err != nil {
		return Request{}, `arguments are not a JSON object {"description","prompt",...}: ` + err.Error(), CodeInvalidArgs
	}
	for k := range raw {
		switch k {
		case "description", "prompt", "run_in_background":
			continue
		}
		if !slices.Contains(capabilities[mode], k) {
			return Request{}, fmt.Sprintf("the %s provider does not support %q (supported: %s)", providerName(mode), k,
				strings.Join(capabilities[mode], ", ")), CodeUnsupported
		}
	}
	var in struct {
		Description  string          `json:"description"`
		Prompt       string          `json:"prompt"`
		Background   bool            `json:"run_in_background"`
		Tools        []string        `json:"tools"`
		Persona      string          `json:"persona"`
		OutputSchema json.RawMessage `json:"output_schema"`
	}
	if err := json.Unmarshal([]byte(ex.GetArguments()), &in); err != nil {
		return Request{}, "arguments have the wrong types: " + err.Error(), CodeInvalidArgs
	}
	if strings.TrimSpace(in.Description) == "" || strings.TrimSpace(in.Prompt) == "" {
		return Request{}, "description and prompt must both be non-empty", CodeInvalidArgs
	}
	c := ex.GetContext()
	req := Request{ParentID: c.GetSessionId(), ToolCallID: ex.GetCallId(), Turn: c.GetTurn(), Mode: mode,
		Description: in.Description, Prompt: in.Prompt, Background: in.Background, Tools: in.Tools, Persona: in.Persona}
	if len(in.OutputSchema) > 0 && string(in.OutputSchema) != "null" {
		req.OutputSchema = string(in.OutputSchema)
		if errs := CheckSchema(req.OutputSchema); len(errs) > 0 {
			return Request{}, "output_schema is outside the supported subset: " + strings.Join(errs, "; "), CodeInvalidSchem
		}
	}
	return req, "", ""
}

func providerName(m sessionv1.SubagentMode) string {
	if m == sessionv1.SubagentMode_SUBAGENT_MODE_FORK {
		return "fork"
	}
	return "spawn"
}

func (h *Host) delegate(ctx context.Context, ex *toolsv1.ToolExecution, mode sessionv1.SubagentMode) *toolsv1.ToolExecutionResult {
	req, msg, code := h.parse(ex, mode)
	if code != "" {
		return errorResult(msg, code)
	}
	depth, err := h.Sessions.Depth(req.ParentID)
	if err != nil {
		return errorResult(err.Error(), CodeStartFailed)
	}
	req.Depth = depth + 1
	if h.MaxDepth <= 0 {
		return errorResult("delegation is disabled in this deployment (max depth 0)", CodeDepthLimit)
	}
	if req.Depth > h.MaxDepth {
		return errorResult(fmt.Sprintf("a child here would be at delegation depth %d; the limit is %d: do the task yourself",
			req.Depth, h.MaxDepth), CodeDepthLimit)
	}
	if len(req.Tools) > 0 {
		known := h.Sessions.ToolNames(req.ParentID)
		var unknown []string
		for _, t := range req.Tools {
			if !slices.Contains(known, t) {
				unknown = append(unknown, t)
			}
		}
		if len(unknown) > 0 {
			return errorResult(fmt.Sprintf("tools filter names tools this session does not have: %s (available: %s)",
				strings.Join(unknown, ", "), strings.Join(known, ", ")), CodeUnknownTool)
		}
	}
	if req.Background {
		return h.background(ctx, req)
	}
	child, err := h.Sessions.Start(ctx, req)
	if err != nil {
		return errorResult("could not start the subagent: "+err.Error(), CodeStartFailed)
	}
	out := child.Wait(ctx)
	h.Sessions.End(context.WithoutCancel(ctx), req, child, out)
	return resultOf(child.ID(), req, out)
}

// resultOf is the model-facing result of a finished child: its final
// answer, or an error result without partial output when it did not
// complete (§7.7).
func resultOf(childID string, req Request, out Outcome) *toolsv1.ToolExecutionResult {
	if out.StopReason != "completed" {
		msg := fmt.Sprintf("subagent %s (%s) ended %s", childID, req.Description, out.StopReason)
		if out.Error != "" {
			msg += ": " + out.Error
		}
		return errorResult(msg, CodeChildFailed)
	}
	if req.OutputSchema == "" {
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(out.Output)}}
	}
	res := struct {
		Output          string          `json:"output"`
		Structured      json.RawMessage `json:"structured,omitempty"`
		StructuredError string          `json:"structured_error,omitempty"`
	}{Output: out.Output, Structured: out.Structured}
	if out.Structured == nil {
		res.StructuredError = "the subagent did not call " + CaptureTool + " with a value satisfying the schema"
	}
	b, _ := json.Marshal(res)
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(string(b))}}
}

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func errorResult(msg, code string) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("Error: " + msg)}, IsError: true,
		Error: &toolsv1.ToolErrorInfo{Name: "SubagentError", Code: code}}
}

// ErrNoSession is returned for a parent that is not live.
var ErrNoSession = errors.New("the delegating session is not live")
