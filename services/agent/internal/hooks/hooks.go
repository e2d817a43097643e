// Package hooks holds the agent/* extension points of the loop as ordered
// chains of Go listeners (semantics.md §4.11), the two built-in listeners
// (the dsh-llm-retry policy on agent/request-error and the system-prompt
// assembly of §7.9), and remote AgentHooks links that join the same chains
// over gRPC with a deadline and a fail-open or fail-closed setting.
//
// A waterfall point is a Chain: links run in registration order, each gets
// the input and next; calling next delegates to the rest of the chain (the
// last link reaches the loop's default), returning without it short-circuits.
// A serial point that collects contexts is Listeners (every listener runs in
// order; the first error stops). agent/turn-stop is Stoppers (stops at the
// first listener that asks to stop).
//
// # Ordering
//
// Links and listeners run in the order they were added, on the loop's
// driver goroutine; a panic in a listener is recovered and becomes its error.
package hooks

import (
	"context"
	"fmt"
	"runtime/debug"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

// Next delegates to the rest of a chain.
type Next[In, Out any] func(ctx context.Context, in In) (Out, error)

// Link is one listener of a waterfall point.
type Link[In, Out any] func(ctx context.Context, in In, next Next[In, Out]) (Out, error)

// Chain is an ordered waterfall. The zero value is an empty chain.
type Chain[In, Out any] struct {
	links []Link[In, Out]
}

// Use appends a link.
func (c *Chain[In, Out]) Use(l Link[In, Out]) { c.links = append(c.links, l) }

// Len is the number of links.
func (c *Chain[In, Out]) Len() int { return len(c.links) }

// Run runs the chain with dflt as the innermost default.
func (c *Chain[In, Out]) Run(ctx context.Context, in In, dflt Next[In, Out]) (Out, error) {
	if len(c.links) == 0 {
		return dflt(ctx, in) // no closures to build (an empty chain is the common case)
	}
	var at func(i int) Next[In, Out]
	at = func(i int) Next[In, Out] {
		if i >= len(c.links) {
			return dflt
		}
		return func(ctx context.Context, in In) (out Out, err error) {
			defer recoverInto(&err)
			return c.links[i](ctx, in, at(i+1))
		}
	}
	return at(0)(ctx, in)
}

// Listener is a serial listener that may contribute contexts.
type Listener[In any] func(ctx context.Context, in In) ([]*toolsv1.HookContext, error)

// Listeners is an ordered list of serial listeners.
type Listeners[In any] struct {
	ls []Listener[In]
}

// Use appends a listener.
func (l *Listeners[In]) Use(fn Listener[In]) { l.ls = append(l.ls, fn) }

// Run runs every listener in order and concatenates their contexts; the first
// error stops the run.
func (l *Listeners[In]) Run(ctx context.Context, in In) ([]*toolsv1.HookContext, error) {
	var out []*toolsv1.HookContext
	for _, fn := range l.ls {
		cs, err := func() (cs []*toolsv1.HookContext, err error) {
			defer recoverInto(&err)
			return fn(ctx, in)
		}()
		if err != nil {
			return out, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// Stopper is an agent/turn-stop listener; true requests a terminal stop.
type Stopper func(ctx context.Context, in *TurnStop) (bool, error)

// Stoppers is the serial agent/turn-stop point: the first true wins.
type Stoppers struct {
	ls []Stopper
}

// Use appends a listener.
func (s *Stoppers) Use(fn Stopper) { s.ls = append(s.ls, fn) }

// Run returns true at the first listener that asks to stop.
func (s *Stoppers) Run(ctx context.Context, in *TurnStop) (bool, error) {
	for _, fn := range s.ls {
		stop, err := func() (stop bool, err error) {
			defer recoverInto(&err)
			return fn(ctx, in)
		}()
		if err != nil || stop {
			return stop, err
		}
	}
	return false, nil
}

func recoverInto(err *error) {
	if v := recover(); v != nil {
		*err = fmt.Errorf("hook panicked: %v\n%s", v, debug.Stack())
	}
}

// Subject identifies the session a hook runs for.
type Subject struct {
	SessionID string
	Cwd       string
	Options   *sessionv1.SessionOptions
}

// PromptSubmit is the input of agent/prompt-submit.
type PromptSubmit struct {
	Subject
	Turn     int32
	Content  []*llmv1.ContentBlock
	Source   *llmv1.MessageSource
	Contexts []*toolsv1.HookContext
}

// SessionPrefix is the input of agent/session-prefix.
type SessionPrefix struct {
	Subject
	Prefix []*llmv1.Message
}

// Step is the input of agent/pre-step and agent/post-step.
type Step struct {
	Subject
	Turn, Step int32
}

// Request is the input of agent/request.
type Request struct {
	Subject
	Turn, Step int32
	Config     *llmv1.LlmCallConfig
}

// StepResult is the input of agent/step-result.
type StepResult struct {
	Subject
	Turn, Step int32
	Message    *llmv1.Message
}

// RequestError is the input of agent/request-error.
type RequestError struct {
	Subject
	Turn, Step    int32
	Err           error
	Failure       *llmv1.LlmFailure
	PriorFailures []*llmv1.LlmFailure
	// Append logs a log-only event into the open turn (e.g. llm/retry).
	Append func(ev *sessionv1.SessionEvent) error
}

// Continuation is the input of agent/turn-continuation.
type Continuation struct {
	Subject
	Turn    int32
	Default *agentv1.ContinuationDecision
}

// TurnStop is the input of agent/turn-stop.
type TurnStop struct {
	Subject
	Turn int32
}

// PromptSections is the input of agent/prompt-sections: a turn's extra
// system-prompt sections (added, or replacing same-named ones).
type PromptSections struct {
	Subject
	Turn int32
}

// SessionStart is the input of agent/session-start.
type SessionStart struct {
	Subject
	// Source is "startup" or "resume".
	Source string
}

// Set is every agent/* point of one deployment. The zero value has no
// listeners: every point takes the loop's default.
type Set struct {
	PromptSubmit     Chain[*PromptSubmit, *agentv1.PromptDecision]
	SessionPrefix    Chain[*SessionPrefix, []*llmv1.Message]
	PreStep          Listeners[*Step]
	Request          Chain[*Request, *llmv1.LlmCallConfig]
	StepResult       Chain[*StepResult, *llmv1.Message]
	RequestError     Chain[*RequestError, *agentv1.RequestErrorDecision]
	PostStep         Listeners[*Step]
	TurnContinuation Chain[*Continuation, *agentv1.ContinuationDecision]
	TurnStop         Stoppers
	SessionStart     Listeners[*SessionStart]
	PromptSections   Chain[*PromptSections, []prompt.Section]
}

// Decision helpers.

// Allow is an allow decision carrying contexts.
func Allow(contexts []*toolsv1.HookContext) *agentv1.PromptDecision {
	return &agentv1.PromptDecision{Kind: &agentv1.PromptDecision_Allow{Allow: &agentv1.PromptAllow{AdditionalContexts: contexts}}}
}

// Block is a block decision.
func Block(reason string) *agentv1.PromptDecision {
	return &agentv1.PromptDecision{Kind: &agentv1.PromptDecision_Block{Block: &agentv1.PromptBlock{Reason: reason}}}
}

// Fail is the fail decision of agent/request-error.
func Fail() *agentv1.RequestErrorDecision {
	return &agentv1.RequestErrorDecision{Action: &agentv1.RequestErrorDecision_Fail{Fail: &agentv1.FailRequest{}}}
}

// Retry is the retry decision of agent/request-error.
func Retry() *agentv1.RequestErrorDecision {
	return &agentv1.RequestErrorDecision{Action: &agentv1.RequestErrorDecision_Retry{Retry: &agentv1.RetryRequest{}}}
}

// Stop is the stop decision of agent/turn-continuation.
func Stop() *agentv1.ContinuationDecision {
	return &agentv1.ContinuationDecision{Action: &agentv1.ContinuationDecision_Stop{Stop: &agentv1.StopTurn{}}}
}

// Continue is the continue decision of agent/turn-continuation.
func Continue() *agentv1.ContinuationDecision {
	return &agentv1.ContinuationDecision{Action: &agentv1.ContinuationDecision_Continue{Continue: &agentv1.ContinueTurn{}}}
}
