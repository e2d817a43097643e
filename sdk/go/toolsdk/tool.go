package toolsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Stable error codes of the SDK's own failures.
const (
	CodeInvalidArgs         = "INVALID_ARGS"
	CodeUnknownTool         = "UNKNOWN_TOOL"
	CodeToolTimeout         = "TOOL_TIMEOUT"
	CodeAborted             = "ABORTED"
	CodeToolPanic           = "TOOL_PANIC"
	CodeInvalidResult       = "INVALID_RESULT"
	defaultErrorName        = "ToolError"
	abortErrorName          = "AbortError"
	defaultHostTimeout      = 2 * time.Minute
	defaultMaxArgumentBytes = 1 << 20
)

// Tool is one tool a Host serves. Build tools with Define (typed arguments
// validated against a schema derived from a Go struct) or RawTool (a raw JSON
// Schema; the body validates its own input). Every method except Run must be
// pure: the presenters and the classifier run at prepare time and again on
// replay, so they may depend only on their inputs.
type Tool interface {
	// Descriptor is the model-facing schema plus the execution metadata.
	Descriptor() *toolsv1.ToolDescriptor
	// Mode classifies one call from its raw arguments. It never fails:
	// malformed arguments are exclusive.
	Mode(args string) toolsv1.ExecutionMode
	// PresentCall is the pending card of a call, or nil for the generic
	// fallback. It soft-fails to nil on arguments it cannot decode.
	PresentCall(args string) *toolsv1.ToolCallView
	// PresentResult is the completed card of a call, or nil for the generic
	// fallback. It soft-fails to nil on arguments it cannot decode.
	PresentResult(args string, res *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView
	// Run executes the call: validation (typed tools), then the body.
	Run(ctx context.Context, call *Call) (Result, error)
}

// Call is what a tool body sees of one call: its identity, raw arguments and
// the session context the agent sent, plus a channel for live output.
type Call struct {
	// ID is the model's tool-call id.
	ID string
	// Name is the tool name.
	Name string
	// Arguments is the raw JSON argument text as the model produced it.
	Arguments string
	// SessionID is the calling session.
	SessionID string
	// Cwd is the session's absolute working directory (always set).
	Cwd string
	// WorkspaceRoot is the absolute root the agent asked file tools to be
	// confined to; empty means the host's own configuration.
	WorkspaceRoot string
	// Turn and Step locate the call in the session.
	Turn, Step int32
	// Sandbox is the call's effective confinement as the agent resolved it
	// (mode, network; the root is WorkspaceRoot); nil when the caller sent
	// none. A host that enforces it declares HostConfig.SandboxSupport.
	Sandbox *toolsv1.SandboxPolicy
	// Vetted is what HostConfig.VetContext returned for this call's
	// context when Execute checked it; nil for calls built by NewCall or
	// run by Host.Run, and when the host has no VetContext.
	Vetted any

	output func(stream, text string)
}

// Output streams a chunk of live output to the caller (an ExecuteResponse
// output message). Safe for concurrent use; a no-op once the call finished
// or when nobody listens.
func (c *Call) Output(stream, text string) {
	if c.output != nil && text != "" {
		c.output(stream, text)
	}
}

// NewCall builds a Call for tests and in-process use; output receives the
// live output chunks and may be nil.
func NewCall(exec *toolsv1.ToolExecution, output func(stream, text string)) *Call {
	c := &Call{ID: exec.GetCallId(), Name: exec.GetName(), Arguments: exec.GetArguments(), output: output}
	if tc := exec.GetContext(); tc != nil {
		c.SessionID, c.Cwd, c.WorkspaceRoot = tc.GetSessionId(), tc.GetCwd(), tc.GetWorkspaceRoot()
		c.Turn, c.Step = tc.GetTurn(), tc.GetStep()
		c.Sandbox = tc.GetSandbox()
	}
	return c
}

// Result is a successful tool outcome. Failures are returned as errors: the
// host renders them as "Error: <message>" with is_error set, and an error with
// a Code() string method (see Error) also fills the structured {name, code}.
type Result struct {
	// Content is the model-facing content.
	Content []*llmv1.ContentBlock
	// Meta is the tool-private presentation payload, marshalled to JSON and
	// handed back to PresentResult (live and on replay). json.RawMessage
	// passes through unchanged.
	Meta any
	// Contexts are additional contexts to inject after the result.
	Contexts []*toolsv1.HookContext
	// View, when set, is the completed card, overriding PresentResult.
	View *toolsv1.ToolResultView
	// Enforcement says how much of the call's sandbox policy was enforced.
	Enforcement toolsv1.SandboxEnforcement
}

// Text is a Result of one text block.
func Text(s string) Result { return Result{Content: []*llmv1.ContentBlock{TextBlock(s)}} }

// TextBlock is a text content block.
func TextBlock(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

// ResultText concatenates the text blocks of a result.
func ResultText(content []*llmv1.ContentBlock) string {
	var s string
	for _, b := range content {
		s += b.GetText().GetText()
	}
	return s
}

// Error is a typed tool failure: the model sees "Error: <message>" and the
// result carries {name, code}.
type Error struct {
	name, code, msg string
	err             error
}

// Errorf builds a typed failure of class ToolError with the given code; a %w
// verb in format keeps the cause for errors.Is / errors.As.
func Errorf(code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{code: code, msg: err.Error(), err: errors.Unwrap(err)}
}

// NewError builds a typed failure with an explicit class name (e.g. FsError).
func NewError(name, code, message string, cause error) *Error {
	return &Error{name: name, code: code, msg: message, err: cause}
}

func (e *Error) Error() string { return e.msg }

// Code is the stable code.
func (e *Error) Code() string { return e.code }

// ErrorName is the error class; ToolError unless NewError named one.
func (e *Error) ErrorName() string {
	if e.name == "" {
		return defaultErrorName
	}
	return e.name
}

func (e *Error) Unwrap() error { return e.err }

// Option configures a tool built by Define or RawTool. Options that carry an
// argument type (PresentCall, PresentResult, ConcurrencySafe) must use the
// tool's Args type; a mismatch panics at definition time.
type Option interface{ apply(t any) error }

type optionFunc func(t any) error

func (f optionFunc) apply(t any) error { return f(t) }

type commonSetter interface{ base() *common }

type common struct {
	timeout    time.Duration
	alwaysSafe bool
}

func (c *common) base() *common { return c }

// Timeout sets the tool's cooperative time budget: the body's context is
// cancelled when it passes, and a body that returns because of it yields a
// TOOL_TIMEOUT error result. Zero means the host default; negative panics.
func Timeout(d time.Duration) Option {
	return optionFunc(func(t any) error {
		if d < 0 {
			return fmt.Errorf("timeout %v is negative", d)
		}
		t.(commonSetter).base().timeout = d
		return nil
	})
}

// AlwaysConcurrencySafe marks every call of the tool parallel-safe.
func AlwaysConcurrencySafe() Option {
	return optionFunc(func(t any) error {
		t.(commonSetter).base().alwaysSafe = true
		return nil
	})
}

// ConcurrencySafe classifies calls per call: only an exact true makes a call
// parallel; invalid arguments, false or a panic make it exclusive.
func ConcurrencySafe[Args any](f func(Args) bool) Option {
	return optionFunc(func(t any) error {
		tt, ok := t.(*typed[Args])
		if !ok {
			return fmt.Errorf("ConcurrencySafe argument type %T does not match the tool's", *new(Args))
		}
		tt.safe = f
		return nil
	})
}

// PresentCall sets the pending-card presenter. It receives decoded, valid
// arguments; calls whose arguments do not validate get the generic fallback.
func PresentCall[Args any](f func(Args) *toolsv1.ToolCallView) Option {
	return optionFunc(func(t any) error {
		tt, ok := t.(*typed[Args])
		if !ok {
			return fmt.Errorf("PresentCall argument type %T does not match the tool's", *new(Args))
		}
		tt.presentCall = f
		return nil
	})
}

// PresentResult sets the completed-card presenter. It receives decoded,
// valid arguments and the result (content, is_error, meta).
func PresentResult[Args any](f func(Args, *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView) Option {
	return optionFunc(func(t any) error {
		tt, ok := t.(*typed[Args])
		if !ok {
			return fmt.Errorf("PresentResult argument type %T does not match the tool's", *new(Args))
		}
		tt.presentResult = f
		return nil
	})
}

// toolNamePattern is the rule of tool names, checked by validToolName (a
// loop: compiling the regular expression cost every program linking the SDK
// ~1 ms at start, docs/arch/throughput.md §17).
const toolNamePattern = `^[a-zA-Z0-9_-]{1,64}$`

// validToolName reports whether name matches toolNamePattern.
func validToolName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Define builds a typed tool. Args must be a struct type; its JSON Schema is
// derived by SchemaFor and the model's arguments are validated against it
// before fn runs (violations → INVALID_ARGS result listing each path). Define
// panics on a definition error (bad name, unsupported field type, mismatched
// option), which is a programming error found at start-up.
func Define[Args any](name, description string, fn func(ctx context.Context, call *Call, args Args) (Result, error), opts ...Option) Tool {
	s, err := SchemaFor[Args]()
	if err == nil && s.Type != "object" {
		err = fmt.Errorf("argument type %s is not a struct", fmt.Sprintf("%T", *new(Args)))
	}
	if err != nil {
		panic(fmt.Sprintf("toolsdk.Define(%q): %v", name, err))
	}
	params, _ := s.MarshalJSON()
	return newTyped(name, description, string(params), s, fn, opts)
}

// RawTool builds a tool from a raw JSON Schema (an object schema, e.g. from an
// MCP server or a bridge). The host does not validate its arguments beyond
// requiring a JSON value; the body gets them raw and validates itself.
func RawTool(name, description string, parameters json.RawMessage, fn func(ctx context.Context, call *Call, args json.RawMessage) (Result, error), opts ...Option) Tool {
	var root struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(parameters, &root); err != nil || root.Type != "object" {
		panic(fmt.Sprintf("toolsdk.RawTool(%q): parameters must be a JSON Schema object with \"type\":\"object\"", name))
	}
	return newTyped(name, description, string(parameters), nil, fn, opts)
}

func newTyped[Args any](name, description, params string, s *Schema, fn func(context.Context, *Call, Args) (Result, error), opts []Option) *typed[Args] {
	if !validToolName(name) {
		panic(fmt.Sprintf("toolsdk: tool name %q must match %s", name, toolNamePattern))
	}
	if fn == nil {
		panic(fmt.Sprintf("toolsdk: tool %q has no body", name))
	}
	t := &typed[Args]{name: name, description: description, params: params, schema: s, fn: fn}
	for _, o := range opts {
		if err := o.apply(t); err != nil {
			panic(fmt.Sprintf("toolsdk: tool %q: %v", name, err))
		}
	}
	conc := toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_UNSPECIFIED
	switch {
	case t.alwaysSafe:
		conc = toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS
	case t.safe != nil:
		conc = toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_PER_CALL
	}
	t.desc = &toolsv1.ToolDescriptor{
		Schema:             &llmv1.ToolSchema{Name: name, Description: description, Parameters: params},
		Concurrency:        conc,
		TimeoutMs:          t.timeout.Milliseconds(),
		ValidatesArguments: s != nil,
	}
	return t
}

type typed[Args any] struct {
	common
	name, description, params string
	schema                    *Schema // nil for raw tools
	fn                        func(context.Context, *Call, Args) (Result, error)
	desc                      *toolsv1.ToolDescriptor
	safe                      func(Args) bool
	presentCall               func(Args) *toolsv1.ToolCallView
	presentResult             func(Args, *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView
}

func (t *typed[Args]) Descriptor() *toolsv1.ToolDescriptor { return t.desc }

// decode validates (typed tools) and decodes the arguments.
func (t *typed[Args]) decode(raw string) (Args, error) {
	var a Args
	if t.schema != nil {
		if v := Validate(t.schema, []byte(raw)); len(v) > 0 {
			return a, &ArgsError{Violations: v}
		}
	} else if !json.Valid([]byte(raw)) {
		_, err := decodeJSON([]byte(raw)) // its words for what is wrong
		return a, &ArgsError{Violations: []string{"arguments are not valid JSON: " + fmt.Sprint(err)}}
	}
	if err := unmarshalArgs([]byte(raw), &a); err != nil {
		return a, &ArgsError{Violations: []string{err.Error()}}
	}
	return a, nil
}

func (t *typed[Args]) Mode(args string) (mode toolsv1.ExecutionMode) {
	if t.alwaysSafe {
		return toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL
	}
	mode = toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE
	if t.safe == nil {
		return mode
	}
	a, err := t.decode(args)
	if err != nil {
		return mode
	}
	defer func() { _ = recover() }()
	if t.safe(a) {
		mode = toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL
	}
	return mode
}

func (t *typed[Args]) PresentCall(args string) (v *toolsv1.ToolCallView) {
	if t.presentCall == nil {
		return nil
	}
	a, err := t.decode(args)
	if err != nil {
		return nil
	}
	defer func() {
		if recover() != nil {
			v = nil
		}
	}()
	return t.presentCall(a)
}

func (t *typed[Args]) PresentResult(args string, res *toolsv1.ToolExecutionResult) (v *toolsv1.ToolResultView) {
	if t.presentResult == nil {
		return nil
	}
	a, err := t.decode(args)
	if err != nil {
		return nil
	}
	defer func() {
		if recover() != nil {
			v = nil
		}
	}()
	return t.presentResult(a, res)
}

func (t *typed[Args]) Run(ctx context.Context, call *Call) (Result, error) {
	r, _, err := t.runPresent(ctx, call)
	return r, err
}

// runPresent runs the call and returns its result presenter bound to the
// already decoded arguments (nil when they did not decode), sparing the
// host a second validation.
func (t *typed[Args]) runPresent(ctx context.Context, call *Call) (Result, func(*toolsv1.ToolExecutionResult) *toolsv1.ToolResultView, error) {
	a, err := t.decode(call.Arguments)
	if err != nil {
		return Result{}, nil, err
	}
	present := func(res *toolsv1.ToolExecutionResult) (v *toolsv1.ToolResultView) {
		if t.presentResult == nil {
			return nil
		}
		defer func() {
			if recover() != nil {
				v = nil
			}
		}()
		return t.presentResult(a, res)
	}
	r, err := t.fn(ctx, call, a)
	return r, present, err
}

// presentingTool is implemented by the SDK's own tools.
type presentingTool interface {
	runPresent(ctx context.Context, call *Call) (Result, func(*toolsv1.ToolExecutionResult) *toolsv1.ToolResultView, error)
}
