package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/stackgrow"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

// Tools is the tool seam the loop consumes (the toolpipe registry and
// staged pipeline). hosts is the session's toolhost visibility. Schemas
// may return the same shared slice on every call: it must not be mutated.
type Tools interface {
	Schemas(hosts []string) []*llmv1.ToolSchema
	PrepareCalls(ctx context.Context, hosts []string, execs []*toolsv1.ToolExecution) []*toolsv1.PreparedCall
	Begin(ctx context.Context, hosts []string, ex *toolsv1.ToolExecution) ToolCall
	// Release drops what PrepareCalls holds for the executions of execs
	// that Begin did not take (a toolpipe's prepared PrepareExecute
	// streams); the loop calls it once each batch is over.
	Release(execs []*toolsv1.ToolExecution)
}

// ToolCall is one call in the staged pipeline: Begin ran pre-execute and the
// guards; Dispatch runs the body (concurrently with other calls); Finish runs
// post-execute and returns the final result.
//
// Finish returns the call's final result, which becomes the caller's
// alone: the loop hands its content, error and meta to the session log
// without a copy, so nothing may keep or change them afterwards.
type ToolCall interface {
	Dispatch(ctx context.Context, checkpoint func(context.Context) error)
	Finish(ctx context.Context) *toolsv1.ToolExecutionResult
}

// SystemPrompt assembles the system prompt, the tool order and the default
// session prefix of a request. Assemble must be a pure function of its
// input (as prompt.Assembler is): the loop reuses the previous step's
// result when the input is the same.
type SystemPrompt interface {
	Assemble(in prompt.Input) (prompt.Assembly, error)
}

// Workspace reads the workspace context of a session's cwd, within its
// workspace root (empty: each host's), from its toolhosts (the version
// tells a changed context).
type Workspace interface {
	Context(ctx context.Context, cwd, root string, hosts []string) (*toolsv1.GetWorkspaceContextResponse, error)
}

// Config configures an Agent.
type Config struct {
	LLM    LLM
	Tools  Tools        // nil: no tools
	Hooks  *hooks.Set   // nil: every point takes its default
	Prompt SystemPrompt // nil: no system prompt
	// Workspace is read at the start of every turn; a changed version
	// re-assembles the prompt and the prefix (a new request/header). nil:
	// no workspace context.
	Workspace Workspace
	// Flush makes everything appended so far durable. nil: no durability.
	Flush func(ctx context.Context) error
	// MaxParallelToolCalls bounds overlapping parallel-safe calls; default 10.
	MaxParallelToolCalls int
	// Debug runs session.CheckLog and the request-equation check before
	// every request and fails the turn on a mismatch.
	Debug  bool
	Logger *slog.Logger
	// OnStatus observes status transitions (must not block).
	OnStatus func(agentv1.AgentStatus)
	// OnError observes every reported failure (agent/error).
	OnError func(turn, step int32, err error)
	// Limits bound the inbox (Send and Steer beyond them fail with a
	// *QueueFullError).
	Limits QueueLimits
	// Approval reports the session's effective approval policy (for the
	// system prompt); nil: not stated.
	Approval interface {
		Policy() sessionv1.ApprovalPolicy
	}
	// Sandbox is the deployment's default confinement (mode and network
	// set); a session's options and sandbox/mode events override it.
	Sandbox *toolsv1.SandboxPolicy
	// Context compacts and prunes the context (pressure after a step,
	// recovery from CONTEXT_WINDOW_EXCEEDED); nil: neither.
	Context ContextManager
}

// Item is one inbox entry (a send or a steer).
type Item struct {
	Content  []*llmv1.ContentBlock
	Source   *llmv1.MessageSource
	Contexts []*toolsv1.HookContext
	// QueuedBy is the span of the RPC that queued the item; the turn's
	// span links to it (a turn is its own trace).
	QueuedBy trace.SpanContext
	// RequestID is the client's idempotency key (empty when none): an item
	// whose key the session has seen is not queued again, and the event
	// that records it (turn/start, steering/message) carries the key.
	RequestID string

	size     int64 // encoded size accounted for in the bounds
	admitted bool  // counted in the bounds (client items, not internal ones)
}

// Cancel causes.
var (
	ErrCancelUser   = errors.New("cancelled by the user")
	ErrCancelParent = errors.New("cancelled by the parent agent")
	// ErrDisposed is the disposal cause and the error of commands on a
	// disposed agent.
	ErrDisposed = errors.New("agent disposed")
)

// errCancelled unwinds a turn at a checkpoint.
var errCancelled = errors.New("turn cancelled")

// Agent is the live handle of one session.
type Agent struct {
	cfg  Config
	log  *session.Log
	h    *sessionv1.SessionHeader
	subj hooks.Subject
	hk   *hooks.Set
	lg   *slog.Logger

	ctx     context.Context
	dispose context.CancelCauseFunc
	done    chan struct{} // closed once disposed and no driver runs

	mu          sync.Mutex
	queued      []Item
	steering    []Item
	queuedBytes int64 // bytes of the admitted items in queued and steering
	status      agentv1.AgentStatus
	disposed    bool
	started     bool
	live        bool // Start finished: queued items start a driver
	driving     bool // a driver goroutine runs (only while there is work)
	turnCancel  context.CancelCauseFunc
	exclusive   bool // an Exclusive zero-step turn is open: no turn starts
	inBatch     bool
	batchFIFO   []*sessionv1.SessionEvent
	lastTurn    int32
	requests    map[string]struct{} // request ids admitted or found in the log
	waiters     []chan struct{}
	idleFlushes sync.WaitGroup

	// Driver-only state.
	checker      session.Checker // debug mode: the log's events checked so far
	checked      int
	headerLogged bool
	prefix       []*llmv1.Message
	prefixSet    bool
	sandbox      sandboxFold
	ws           *toolsv1.GetWorkspaceContextResponse
	sections     []prompt.Section // this turn's agent/prompt-sections
	asm          *asmCache        // the last assembly (turn.go); nil while idle
}

// New returns an agent over log. It does not start the driver; call Start.
func New(cfg Config, log *session.Log) *Agent {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxParallelToolCalls <= 0 {
		cfg.MaxParallelToolCalls = 10
	}
	hk := cfg.Hooks
	if hk == nil {
		hk = &hooks.Set{}
	}
	h := log.Header()
	ctx, cancel := context.WithCancelCause(context.Background())
	a := &Agent{
		cfg: cfg, log: log, h: h, hk: hk,
		subj:    hooks.Subject{SessionID: h.GetId(), Cwd: h.GetCwd(), Options: h.GetOptions()},
		lg:      cfg.Logger.With("session", h.GetId()),
		ctx:     ctx,
		dispose: cancel,
		done:    make(chan struct{}),
		status:  agentv1.AgentStatus_AGENT_STATUS_IDLE,
	}
	a.lastTurn = log.NextTurn() - 1
	a.requests = make(map[string]struct{})
	for _, ev := range log.Events() {
		if id := ev.GetRequestId(); id != "" {
			a.requests[id] = struct{}{}
		}
	}
	return a
}

// ID is the session id.
func (a *Agent) ID() string { return a.h.GetId() }

// Log is the session log (read-only for callers).
func (a *Agent) Log() *session.Log { return a.log }

// Start emits agent/session-start (source "startup" or "resume"), injects the
// contexts its listeners return, and starts the driver.
func (a *Agent) Start(ctx context.Context, source string) {
	a.mu.Lock()
	if a.started || a.disposed {
		a.mu.Unlock()
		return
	}
	a.started = true
	a.mu.Unlock()
	cs, err := a.hk.SessionStart.Run(ctx, &hooks.SessionStart{Subject: a.subj, Source: source})
	if err != nil {
		a.reportError(0, 0, fmt.Errorf("agent/session-start: %w", err))
	}
	for _, c := range cs {
		if err := a.Inject(c.GetContent(), sourceOr(c.GetSource(), "session-start"), c.Meta); err != nil {
			a.reportError(0, 0, err)
		}
	}
	a.mu.Lock()
	a.live = true
	a.kickLocked()
	a.mu.Unlock()
}

// kickLocked starts a driver when there is queued work and none runs. The
// driver exits when the queue is empty, so an idle session holds no
// goroutine (issue 19: a loaded idle session costs ≤ 10 KiB).
func (a *Agent) kickLocked() {
	if a.live && !a.driving && !a.disposed && !a.exclusive && len(a.queued) > 0 {
		a.driving = true
		go a.run()
	}
}

// Status is the live status.
func (a *Agent) Status() agentv1.AgentStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

// Queued is the number of items in the queued FIFO.
func (a *Agent) Queued() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queued)
}

// Quiescent reports whether nothing runs and nothing is queued.
func (a *Agent) Quiescent() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status != agentv1.AgentStatus_AGENT_STATUS_RUNNING && len(a.queued) == 0
}

// Send queues a prompt: one send, one turn.
func (a *Agent) Send(it Item) (agentv1.AgentStatus, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.disposed {
		return a.status, ErrDisposed
	}
	if a.seenLocked(it.RequestID) {
		return a.status, nil
	}
	if err := a.admitLocked(&it); err != nil {
		return a.status, err
	}
	a.noteLocked(it.RequestID)
	a.queued = append(a.queued, it)
	a.kickLocked()
	if a.status == agentv1.AgentStatus_AGENT_STATUS_IDLE {
		// The driver is about to claim the item: say so rather than IDLE.
		return agentv1.AgentStatus_AGENT_STATUS_RUNNING, nil
	}
	return a.status, nil
}

// Steer submits steering for the running turn; when not running it is a
// send.
func (a *Agent) Steer(it Item) (agentv1.AgentStatus, error) {
	a.mu.Lock()
	if a.disposed {
		defer a.mu.Unlock()
		return a.status, ErrDisposed
	}
	if a.status != agentv1.AgentStatus_AGENT_STATUS_RUNNING {
		a.mu.Unlock()
		return a.Send(it)
	}
	defer a.mu.Unlock()
	if a.seenLocked(it.RequestID) {
		return a.status, nil
	}
	if err := a.admitLocked(&it); err != nil {
		return a.status, err
	}
	a.noteLocked(it.RequestID)
	a.steering = append(a.steering, it)
	return a.status, nil
}

// Inject appends model-facing context without running the model
// (semantics.md §4.4): into the open turn (deferred past a running tool
// batch), or, when idle, as a one-shot injection turn followed by a
// non-blocking flush.
func (a *Agent) Inject(content []*llmv1.ContentBlock, src *llmv1.MessageSource, meta *string) error {
	return a.InjectOnce("", content, src, meta)
}

// InjectOnce is Inject with an idempotency key: an injection whose key the
// session has seen is not appended again; the context/message carries it.
func (a *Agent) InjectOnce(requestID string, content []*llmv1.ContentBlock, src *llmv1.MessageSource, meta *string) error {
	if src == nil {
		src = session.UserSource()
	}
	ev := contextEvent(content, src, meta)
	ev.RequestId = requestID
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.disposed {
		return ErrDisposed
	}
	if a.seenLocked(requestID) {
		return nil
	}
	// The key is noted only once the injection is admitted, so a retry of
	// one that failed is applied, not answered as done.
	if err := a.injectLocked(ev, src); err != nil {
		return err
	}
	a.noteLocked(requestID)
	return nil
}

// injectLocked appends or defers one context/message; a.mu held.
func (a *Agent) injectLocked(ev *sessionv1.SessionEvent, src *llmv1.MessageSource) error {
	if _, open := a.log.OpenTurn(); open {
		if a.inBatch {
			a.batchFIFO = append(a.batchFIFO, ev)
			return nil
		}
		_, err := a.appendLocked(ev)
		return err
	}
	turn := a.lastTurn + 1
	if _, err := a.appendLocked(session.TurnStartEvent(turn, session.InjectionTrigger(src))); err != nil {
		return err
	}
	_, err := a.appendLocked(ev)
	if _, endErr := a.appendLocked(session.TurnEndEvent(turn, completedReason())); endErr != nil {
		return errors.Join(err, endErr)
	}
	if err != nil {
		return err
	}
	a.idleFlushes.Go(func() {
		if ferr := a.flush(context.Background()); ferr != nil {
			a.reportError(turn, 0, fmt.Errorf("flush after injection: %w", ferr))
		}
	})
	return nil
}

// Record appends log-only settings events (session/model, approval/policy,
// sandbox/mode, session/title) so they take effect at the next step: into
// the open turn, or, when idle, as a zero-step turn triggered by the plugin
// trigger trigger, made durable before Record returns (nothing accepted is
// lost). It returns the appended events.
func (a *Agent) Record(ctx context.Context, trigger *sessionv1.TurnTrigger, evs ...*sessionv1.SessionEvent) ([]*sessionv1.SessionEvent, error) {
	a.mu.Lock()
	if a.disposed {
		a.mu.Unlock()
		return nil, ErrDisposed
	}
	var out []*sessionv1.SessionEvent
	_, open := a.log.OpenTurn()
	turn := a.lastTurn + 1
	if !open {
		if _, err := a.appendLocked(session.TurnStartEvent(turn, trigger)); err != nil {
			a.mu.Unlock()
			return nil, err
		}
	}
	var err error
	for _, ev := range evs {
		var got *sessionv1.SessionEvent
		if got, err = a.appendLocked(ev); err != nil {
			break
		}
		out = append(out, got)
	}
	if !open {
		if _, endErr := a.appendLocked(session.TurnEndEvent(turn, completedReason())); endErr != nil {
			err = errors.Join(err, endErr)
		}
	}
	a.mu.Unlock()
	if err != nil {
		return out, err
	}
	if ferr := a.flush(ctx); ferr != nil {
		return out, fmt.Errorf("flush the settings change: %w", ferr)
	}
	return out, nil
}

// Cancel clears both FIFOs and aborts the active turn with cause (the first
// cause of a turn wins). It reports false when idle with nothing pending.
func (a *Agent) Cancel(cause error) bool {
	if cause == nil {
		cause = ErrCancelUser
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.disposed {
		return false
	}
	// The claim of a queued item and the installation of its turn's cancel
	// happen under a.mu, so a cancel either aborts the active turn or clears
	// the item before it is claimed: no pre-run marker is needed.
	active := a.turnCancel != nil
	if !active && len(a.queued) == 0 && len(a.steering) == 0 {
		return false
	}
	a.releaseLocked(a.queued...)
	a.releaseLocked(a.steering...)
	a.queued, a.steering = nil, nil
	if active {
		a.turnCancel(cause)
	}
	return true
}

// WaitIdle blocks until the agent is quiescent (nothing running, nothing
// queued) or ctx ends. A disposed agent waits for its driver to exit.
func (a *Agent) WaitIdle(ctx context.Context) error {
	a.mu.Lock()
	if a.disposed {
		a.mu.Unlock()
		select {
		case <-a.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if a.status != agentv1.AgentStatus_AGENT_STATUS_RUNNING && len(a.queued) == 0 {
		a.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	a.waiters = append(a.waiters, ch)
	a.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Dispose marks the agent disposed, aborts the active turn with the disposed
// cause, and waits (bounded by ctx) for the driver and pending idle-injection
// flushes. It returns the queued items that never ran.
func (a *Agent) Dispose(ctx context.Context) ([]Item, error) {
	a.mu.Lock()
	if a.disposed {
		a.mu.Unlock()
		return nil, nil
	}
	a.disposed = true
	dropped := a.queued
	a.releaseLocked(a.queued...)
	a.releaseLocked(a.steering...)
	a.queued, a.steering = nil, nil
	if !a.driving {
		close(a.done) // else the driver closes it as it exits
	}
	a.setStatusLocked(agentv1.AgentStatus_AGENT_STATUS_DISPOSED)
	a.dispose(ErrDisposed)
	a.mu.Unlock()
	select {
	case <-a.done:
	case <-ctx.Done():
		return dropped, fmt.Errorf("dispose %s: driver did not stop: %w", a.ID(), ctx.Err())
	}
	a.idleFlushes.Wait()
	return dropped, nil
}

// setStatusLocked transitions the status, notifies, and releases WaitIdle
// waiters on a transition out of running.
func (a *Agent) setStatusLocked(s agentv1.AgentStatus) {
	if a.status == s || a.status == agentv1.AgentStatus_AGENT_STATUS_DISPOSED {
		return
	}
	a.status = s
	if s != agentv1.AgentStatus_AGENT_STATUS_RUNNING {
		for _, w := range a.waiters {
			close(w)
		}
		a.waiters = nil
	}
	if a.cfg.OnStatus != nil {
		a.cfg.OnStatus(s)
	}
}

// run is the driver (semantics.md §4.5). It runs while there is queued
// work: kickLocked starts it, and it exits (idle) when the queue is empty.
func (a *Agent) run() {
	// The driver starts afresh per turn (kickLocked) and its first model
	// request runs deep (the gateway client's stream set-up): grown once
	// here, not doubled three times there.
	stackgrow.To16KiB()
	for {
		a.mu.Lock()
		if a.disposed || len(a.queued) == 0 || a.exclusive {
			// An Exclusive turn owns the session: it starts a driver again
			// when it ends (kickLocked).
			a.driving = false
			if a.disposed {
				close(a.done)
			} else if !a.exclusive {
				// Idle: the step cache (the last assembly) goes with the
				// driver — they only save work between
				// a turn's steps, and an idle session holds ≤ 10 KiB
				// (BenchmarkIdleLoadedSessionMemory). Nothing else uses them
				// while neither a driver nor an Exclusive turn runs.
				a.asm = nil
				a.setStatusLocked(agentv1.AgentStatus_AGENT_STATUS_IDLE)
			}
			a.mu.Unlock()
			return
		}
		item := a.queued[0]
		a.queued = a.queued[1:]
		a.releaseLocked(item)
		turnCtx, cancel := context.WithCancelCause(a.ctx)
		a.turnCancel = cancel
		a.setStatusLocked(agentv1.AgentStatus_AGENT_STATUS_RUNNING)
		turn := a.lastTurn + 1
		start := session.TurnStartEvent(turn, session.MessageTrigger(sourceOr(item.Source, "")))
		start.RequestId = item.RequestID
		_, err := a.appendLocked(start)
		if err != nil {
			a.turnCancel = nil
			a.mu.Unlock()
			cancel(nil)
			a.reportError(turn, 0, fmt.Errorf("open turn: %w", err))
			continue
		}
		a.mu.Unlock()

		terminal := a.runTurn(turnCtx, cancel, turn, item)

		a.mu.Lock()
		if !terminal {
			a.queued = append(a.queued, a.steering...)
		} else {
			a.releaseLocked(a.steering...)
		}
		a.steering = nil
		a.mu.Unlock()
	}
}

// append commits one event to the log.
func (a *Agent) append(ev *sessionv1.SessionEvent) (*sessionv1.SessionEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.appendLocked(ev)
}

func (a *Agent) appendLocked(ev *sessionv1.SessionEvent) (*sessionv1.SessionEvent, error) {
	return a.appendLockedHow(ev, a.log.Append)
}

// appendOwned is append for an event the loop built for the log alone and
// hands over (session.Log.AppendOwned: no copy): step bounds, a step's own
// request header, chunks, an assistant message no hook saw, tool calls,
// tool results (the caller's own under the ToolCall.Finish contract, or
// built here), an unstarted call's synthetic result and the todo snapshot.
func (a *Agent) appendOwned(ev *sessionv1.SessionEvent) (*sessionv1.SessionEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.appendLockedHow(ev, a.log.AppendOwned)
}

func (a *Agent) appendLockedHow(ev *sessionv1.SessionEvent, add func(*sessionv1.SessionEvent) (*sessionv1.SessionEvent, error)) (*sessionv1.SessionEvent, error) {
	out, err := add(ev)
	if err != nil {
		return nil, fmt.Errorf("append %s: %w", session.TypeName(ev), err)
	}
	if ts := out.GetTurnStart(); ts != nil {
		a.lastTurn = ts.GetTurn()
	}
	return out, nil
}

// flush runs the durability checkpoint; it is never cancelled by the turn.
func (a *Agent) flush(ctx context.Context) error {
	if a.cfg.Flush == nil {
		return nil
	}
	return a.cfg.Flush(context.WithoutCancel(ctx))
}

func (a *Agent) reportError(turn, step int32, err error) {
	a.lg.Error("agent error", "turn", turn, "step", step, "err", err)
	if a.cfg.OnError != nil {
		a.cfg.OnError(turn, step, err)
	}
}

// seenLocked reports whether the session has admitted (or logged) a command
// with idempotency key id.
func (a *Agent) seenLocked(id string) bool {
	_, ok := a.requests[id]
	return id != "" && ok
}

// noteLocked remembers an admitted command's idempotency key.
func (a *Agent) noteLocked(id string) {
	if id != "" {
		a.requests[id] = struct{}{}
	}
}

func sourceOr(src *llmv1.MessageSource, plugin string) *llmv1.MessageSource {
	if src != nil && src.GetKind() != nil {
		return src
	}
	if plugin == "" {
		return session.UserSource()
	}
	return session.PluginSource(plugin)
}

func contextEvent(content []*llmv1.ContentBlock, src *llmv1.MessageSource, meta *string) *sessionv1.SessionEvent {
	ev := session.ContextMessageEvent(content, src)
	if meta != nil {
		ev.GetContextMessage().Meta = proto.String(*meta)
	}
	return ev
}

func completedReason() *sessionv1.TurnEndReason {
	return &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Completed{Completed: &sessionv1.EndCompleted{}}}
}
