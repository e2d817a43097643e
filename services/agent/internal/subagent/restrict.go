package subagent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// Restrict wraps a session's tools with its child settings (the header's
// SubagentSpec, so a resumed child keeps them): the tool filter (the model
// sees only the allowed tools and a call to another is refused) and the
// forced capture tool of an output schema. A session without a spec gets
// inner unchanged.
func Restrict(inner loop.Tools, spec *sessionv1.SubagentSpec) loop.Tools {
	if spec == nil || (len(spec.GetTools()) == 0 && spec.GetOutputSchema() == "") {
		return inner
	}
	return restricted{inner: inner, spec: spec}
}

type restricted struct {
	inner loop.Tools
	spec  *sessionv1.SubagentSpec
}

func (r restricted) allowed(name string) bool {
	if name == CaptureTool && r.spec.GetOutputSchema() != "" {
		return true
	}
	return len(r.spec.GetTools()) == 0 || slices.Contains(r.spec.GetTools(), name)
}

func (r restricted) Schemas(hosts []string) []*llmv1.ToolSchema {
	var out []*llmv1.ToolSchema
	if r.inner != nil {
		for _, s := range r.inner.Schemas(hosts) {
			if r.allowed(s.GetName()) && s.GetName() != CaptureTool {
				out = append(out, s)
			}
		}
	}
	if sc := r.spec.GetOutputSchema(); sc != "" {
		out = append(out, &llmv1.ToolSchema{Name: CaptureTool, Parameters: sc,
			Description: "Report your final result. You must call this exactly once when done, with arguments " +
				"that satisfy its schema; then reply with a one-line summary."})
	}
	return out
}

func (r restricted) PrepareCalls(ctx context.Context, hosts []string, execs []*toolsv1.ToolExecution) []*toolsv1.PreparedCall {
	if r.inner == nil {
		return nil
	}
	// Index-aligned with execs: a refused or capture call is unknown to
	// inner and gets its default (exclusive) preparation.
	return r.inner.PrepareCalls(ctx, hosts, execs)
}

// Release passes the batch to inner, which prepared every call of it,
// the refused ones included.
func (r restricted) Release(execs []*toolsv1.ToolExecution) {
	if r.inner != nil {
		r.inner.Release(execs)
	}
}

func (r restricted) Begin(ctx context.Context, hosts []string, ex *toolsv1.ToolExecution) loop.ToolCall {
	switch {
	case ex.GetName() == CaptureTool && r.spec.GetOutputSchema() != "":
		return fixed{r: capture(r.spec.GetOutputSchema(), ex.GetArguments())}
	case !r.allowed(ex.GetName()):
		return fixed{r: errorResult(fmt.Sprintf("tool %s is not available to this subagent (allowed: %s)",
			ex.GetName(), strings.Join(r.spec.GetTools(), ", ")), CodeUnknownTool)}
	case r.inner == nil:
		return fixed{r: errorResult("unknown tool: "+ex.GetName(), CodeUnknownTool)}
	}
	return r.inner.Begin(ctx, hosts, ex)
}

// capture checks a structured_output call against the schema.
func capture(schema, args string) *toolsv1.ToolExecutionResult {
	var v any
	if err := json.Unmarshal([]byte(args), &v); err != nil {
		return errorResult("arguments are not JSON: "+err.Error(), "SCHEMA_VIOLATION")
	}
	if errs := Validate(schema, v); len(errs) > 0 {
		return errorResult("the value does not satisfy the schema: "+strings.Join(errs, "; ")+". Call "+CaptureTool+" again.",
			"SCHEMA_VIOLATION")
	}
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("Structured output recorded.")}}
}

// fixed is a call whose result is known at Begin.
type fixed struct{ r *toolsv1.ToolExecutionResult }

func (fixed) Dispatch(context.Context, func(context.Context) error) {}

func (f fixed) Finish(context.Context) *toolsv1.ToolExecutionResult { return f.r }
