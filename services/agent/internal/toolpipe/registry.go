// Package toolpipe is the agent's client side of the tool seam: a registry
// merged from every configured toolhost (ListTools at start, then WatchTools
// with reconnect and backoff) and the staged tools/execute pipeline of
// semantics.md §6.5 — pre-execute → approval → guards → dispatch (the owning
// host's Execute, behind a durability checkpoint) → post-execute — whose
// links are local Go funcs and remote ToolInterceptor services. A batch of
// one remote call is prepared and executed on one PrepareExecute stream
// (prepexec.go).
//
// A failing tool fails its call, never the turn: an unknown tool, a host that
// is down or dies mid-call, a host that breaks the Execute protocol, a
// cancelled call and a refused call all become error results with a stable
// code (UNKNOWN_TOOL, TOOL_HOST_UNAVAILABLE, TOOL_HOST_PROTOCOL_ERROR,
// ABORTED, ABORTED_BEFORE_DISPATCH, CHECKPOINT_FAILED).
//
// # Ordering
//
// Begin runs the pre-dispatch stages synchronously (the loop calls it in
// model order, one call at a time); Dispatch may run concurrently with other
// calls; Finish runs post-execute and is called in model order.
package toolpipe

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/approval"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
)

// Host is one configured toolhost: a remote one (Client) or one the agent
// serves in process (Local, the agent-side tools). Both go through the same
// registry and the same staged pipeline.
type Host struct {
	Name   string
	Client toolsv1.ToolHostClient
	Local  LocalHost
}

// LocalHost is a toolhost served inside the agent process (design round2.md
// §5 "agent-side tools"): its tools need the agent's own state.
type LocalHost interface {
	// Tools lists the host's tools (fixed for the process's life).
	Tools() []*toolsv1.ToolDescriptor
	// Execute runs one call; a failure is an error result, never a panic.
	Execute(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult
}

// Gate is a session's approval stage (services/agent/internal/approval).
// ask is a tool interceptor's ask, nil when none asked. It reports whether
// the call may run, or why not.
type Gate interface {
	// Approve decides whether ex may run, or why not. pathKey is the key
	// the tool reads its path from (approval.PathKeyOf of its schema;
	// PathKeyUnknown when the tool is not known); it calls waiting (when
	// not nil) before it waits for a person's or an approver's answer.
	Approve(ctx context.Context, ex *toolsv1.ToolExecution, ask *toolsv1.PreAsk, pathKey string, waiting func()) (bool, string)
}

// Interceptor is a remote ToolInterceptor link.
type Interceptor struct {
	Name     string
	Client   toolsv1.ToolInterceptorClient
	Timeout  time.Duration
	FailOpen bool
}

// Guard returns a non-empty reason to deny a call.
type Guard func(ex *toolsv1.ToolExecution) string

// PreIn is the input of tools/pre-execute.
type PreIn struct {
	Execution *toolsv1.ToolExecution
}

// PostIn is the input of tools/post-execute. Result is the call's result
// as the session log will take it (Call.Finish): a link reads it and
// answers with a decision, and neither keeps nor changes it.
type PostIn struct {
	Execution *toolsv1.ToolExecution
	Result    *toolsv1.ToolExecutionResult
}

// Config configures a Pipeline.
type Config struct {
	Hosts        []Host
	Interceptors []Interceptor
	Guards       []Guard
	// Gates returns a session's approval gate (nil: no approval channel;
	// an ask denies).
	Gates func(sessionID string) Gate
	// StartTimeout bounds each host's initial ListTools; default 5 s.
	StartTimeout time.Duration
	// BackoffMin and BackoffMax bound the WatchTools reconnect backoff.
	BackoffMin, BackoffMax time.Duration
	Logger                 *slog.Logger
	// AllowUnenforced lets confined calls (read-only, workspace-write) run
	// on hosts that declare they do not enforce sandbox policies; off, such
	// calls get SANDBOX_UNAVAILABLE results without being dispatched.
	AllowUnenforced bool
	// OnHostState, when set, is told every change of a remote host's
	// reachability (and each host's first state after Start), in order per
	// host; err is why it is down.
	OnHostState func(host string, up bool, err error)
	// Progress, when set, is handed every live ToolOutput of a remote
	// call as it arrives, on the call's goroutine: it must not block (the
	// agent fans it out to StreamEvents subscribers, dropping for slow
	// ones). The output is never part of the result.
	Progress func(ex *toolsv1.ToolExecution, out *toolsv1.ToolOutput)
}

type hostState struct {
	host     Host
	tools    map[string]*toolsv1.ToolDescriptor // last known: kept while the host is down
	pathKeys map[string]string                  // tool -> approval.PathKeyOf of its schema
	revision int64
	support  toolsv1.SandboxSupport
	// noPrepareExecute: the host answered PrepareExecute UNIMPLEMENTED;
	// it gets PrepareCalls and Execute until it reconnects.
	noPrepareExecute atomic.Bool
	known            bool  // the state below has been set once
	up               bool  // the last ListTools/WatchTools answered
	err              error // why it is down
}

// HostHealth is one toolhost's reachability.
type HostHealth struct {
	Name string
	Up   bool
	Err  error // why it is down
}

// Pipeline is the merged registry and the staged pipeline. Pre and Post are
// the local links of tools/pre-execute and tools/post-execute; remote
// interceptors run after them.
type Pipeline struct {
	Pre  hooks.Chain[*PreIn, *toolsv1.PreToolDecision]
	Post hooks.Chain[*PostIn, *toolsv1.PostToolDecision]

	cfg   Config
	log   *slog.Logger
	mu    sync.RWMutex
	hosts []*hostState
	owner map[string]*hostState // tool name -> owning host
	gen   uint64                // bumped by every change of a host's tools or the owners
	// schemas caches Schemas per visible-host list for generation gen.
	schemaMu  sync.Mutex
	schemas   map[string][]*llmv1.ToolSchema
	schemaGen uint64
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ready     chan struct{}
	// pending holds the PrepareExecute streams PrepareCalls opened, by
	// execution, until Begin takes them or Release ends them.
	pendMu  sync.Mutex
	pending map[*toolsv1.ToolExecution]*preparedStream
	// drains counts the released streams still being read to their end
	// (release); Close cancels them (drainStop) and waits.
	drainMu     sync.Mutex
	drainClosed bool
	drains      sync.WaitGroup
	drainCtx    context.Context
	drainStop   context.CancelFunc
}

// New returns a pipeline; call Start before use.
func New(cfg Config) *Pipeline {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 5 * time.Second
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 100 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pipeline{cfg: cfg, log: cfg.Logger, owner: map[string]*hostState{}}
	p.drainCtx, p.drainStop = context.WithCancel(context.Background())
	for _, h := range cfg.Hosts {
		p.hosts = append(p.hosts, &hostState{host: h, tools: map[string]*toolsv1.ToolDescriptor{}})
	}
	for _, ic := range cfg.Interceptors {
		p.Pre.Use(ic.preLink(p.log))
		p.Post.Use(ic.postLink(p.log))
	}
	return p
}

// DuplicateToolError reports a tool name served by two hosts.
type DuplicateToolError struct {
	Tool, First, Second string
}

func (e *DuplicateToolError) Error() string {
	return fmt.Sprintf("tool %q is served by two toolhosts, %q and %q: give each tool one owner", e.Tool, e.First, e.Second)
}

// Code is the stable error code.
func (e *DuplicateToolError) Code() string { return "DUPLICATE_TOOL" }

// Start lists every host's tools (a host that does not answer within
// StartTimeout is logged and retried in the background) and starts the
// watchers. A tool name owned by two reachable hosts is a configuration
// error.
func (p *Pipeline) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(p.hosts))
	for i, hs := range p.hosts {
		if hs.host.Local != nil {
			// Agent-side tools touch no files and start no processes:
			// nothing for a sandbox to confine, so they serve confined
			// sessions.
			p.setTools(hs, hs.host.Local.Tools(), 1, toolsv1.SandboxSupport_SANDBOX_SUPPORT_ENFORCED)
			continue
		}
		wg.Go(func() {
			lctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
			defer cancel()
			resp, err := hs.host.Client.ListTools(lctx, &toolsv1.ListToolsRequest{})
			if err != nil {
				errs[i] = err
				return
			}
			p.setTools(hs, resp.GetTools(), resp.GetRevision(), resp.GetSandboxSupport())
			p.setUp(hs, true, nil)
		})
	}
	wg.Wait()
	for i, err := range errs {
		// A start cancelled by its caller (e.g. a dev start failing
		// elsewhere) says nothing of the hosts.
		if err != nil && ctx.Err() == nil {
			p.setUp(p.hosts[i], false, err)
		}
	}
	if err := p.rebuild(true); err != nil {
		return err
	}
	p.logToolSet()
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	for _, hs := range p.hosts {
		if hs.host.Local == nil {
			p.wg.Go(func() { p.watch(wctx, hs) })
		}
	}
	return nil
}

// Close stops the watchers and cancels the released streams still
// being read to their end (a stream released after Close is cancelled at
// once).
func (p *Pipeline) Close() {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	p.drainMu.Lock()
	p.drainClosed = true
	p.drainMu.Unlock()
	p.drainStop()
	p.drains.Wait()
}

func (p *Pipeline) setTools(hs *hostState, tools []*toolsv1.ToolDescriptor, rev int64, support toolsv1.SandboxSupport) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]*toolsv1.ToolDescriptor, len(tools))
	keys := make(map[string]string, len(tools))
	for _, t := range tools {
		if n := t.GetSchema().GetName(); n != "" {
			m[n], keys[n] = t, approval.PathKeyOf(t.GetSchema().GetParameters())
		}
	}
	hs.tools, hs.pathKeys, hs.revision, hs.support = m, keys, rev, support
	p.gen++
}

// rebuild recomputes the name→owner index in host order. With strict, a
// duplicate is an error; otherwise the first host keeps the name and the
// conflict is logged.
func (p *Pipeline) rebuild(strict bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	owner := map[string]*hostState{}
	for _, hs := range p.hosts {
		for name := range hs.tools {
			if first, ok := owner[name]; ok {
				err := &DuplicateToolError{Tool: name, First: first.host.Name, Second: hs.host.Name}
				if strict {
					return err
				}
				p.log.Error("tool conflict; keeping the first host", "err", err)
				continue
			}
			owner[name] = hs
		}
	}
	p.owner = owner
	p.gen++
	return nil
}

func (p *Pipeline) watch(ctx context.Context, hs *hostState) {
	backoff := p.cfg.BackoffMin
	for ctx.Err() == nil {
		stream, err := hs.host.Client.WatchTools(ctx, &toolsv1.WatchToolsRequest{})
		if err == nil {
			for {
				resp, rerr := stream.Recv()
				if rerr != nil {
					err = rerr
					break
				}
				backoff = p.cfg.BackoffMin
				p.setTools(hs, resp.GetTools(), resp.GetRevision(), resp.GetSandboxSupport())
				_ = p.rebuild(false)
				p.setUp(hs, true, nil)
			}
		}
		if ctx.Err() != nil {
			return
		}
		p.setUp(hs, false, err)
		p.log.Debug("toolhost watch broke; reconnecting", "host", hs.host.Name, "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, p.cfg.BackoffMax)
	}
}

// setUp records a remote host's reachability; a change is logged (a host
// going down is a warning naming it) and reported to OnHostState.
func (p *Pipeline) setUp(hs *hostState, up bool, err error) {
	p.mu.Lock()
	changed := !hs.known || hs.up != up
	first := !hs.known
	hs.known, hs.up, hs.err = true, up, err
	n := len(hs.tools)
	p.mu.Unlock()
	if !changed {
		return
	}
	if up {
		hs.noPrepareExecute.Store(false) // a host back may be a newer one
	}
	switch {
	case up && !first:
		p.log.Info("toolhost is back", "host", hs.host.Name, "tools", n)
	case !up && first:
		p.log.Warn("toolhost unreachable at start; its tools fail as unavailable until it answers", "host", hs.host.Name, "err", err)
	case !up:
		p.log.Warn("toolhost down; its tools fail as unavailable until it is back", "host", hs.host.Name, "tools", n, "err", err)
	}
	if p.cfg.OnHostState != nil {
		p.cfg.OnHostState(hs.host.Name, up, err)
	}
}

// HostTools is one host's part of the tool set.
type HostTools struct {
	Name  string
	Local bool // served in process by the agent
	Up    bool
	Tools []string // sorted; the ones this host owns in the merged registry
}

// ToolSet is the merged tool set by host, in configured order: which host
// serves which tool (a host that is down keeps its last-known tools).
func (p *Pipeline) ToolSet() []HostTools {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]HostTools, 0, len(p.hosts))
	for _, hs := range p.hosts {
		ht := HostTools{Name: hs.host.Name, Local: hs.host.Local != nil, Up: hs.up || hs.host.Local != nil}
		for name, owner := range p.owner {
			if owner == hs {
				ht.Tools = append(ht.Tools, name)
			}
		}
		sort.Strings(ht.Tools)
		out = append(out, ht)
	}
	return out
}

// logToolSet logs the tool set at start: one line per host with its tools,
// so a deployment that lost a host (a --toolhost list without the
// built-in one) shows it.
func (p *Pipeline) logToolSet() {
	if p.cfg.Logger == nil {
		return
	}
	total := 0
	for _, h := range p.ToolSet() {
		total += len(h.Tools)
		p.cfg.Logger.Info("toolhost tools", "toolhost", h.Name, "in_process", h.Local, "up", h.Up, "count", len(h.Tools), "tools", strings.Join(h.Tools, ","))
	}
	p.cfg.Logger.Info("tool set ready", "hosts", len(p.hosts), "tools", total)
}

// Health returns the reachability of every remote toolhost, in configured
// order (in-process hosts are always up and not listed).
func (p *Pipeline) Health() []HostHealth {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []HostHealth
	for _, hs := range p.hosts {
		if hs.host.Local == nil {
			out = append(out, HostHealth{Name: hs.host.Name, Up: hs.up, Err: hs.err})
		}
	}
	return out
}

// downHosts names the visible remote hosts that are down.
func (p *Pipeline) downHosts(hosts []string) []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []string
	for _, hs := range p.hosts {
		if hs.host.Local == nil && hs.known && !hs.up && visible(hosts, hs.host.Name) {
			out = append(out, hs.host.Name)
		}
	}
	return out
}

// visible reports whether a host is visible to a session that sees hosts
// (empty = all).
func visible(hosts []string, name string) bool {
	return len(hosts) == 0 || slices.Contains(hosts, name)
}

// lookup resolves a tool as visible to the session.
func (p *Pipeline) lookup(hosts []string, name string) (*hostState, *toolsv1.ToolDescriptor) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	hs := p.ownerLocked(hosts, name)
	if hs == nil {
		return nil, nil
	}
	return hs, hs.tools[name]
}

// ownerLocked is the host serving name when it is visible to hosts, or nil
// (p.mu held).
func (p *Pipeline) ownerLocked(hosts []string, name string) *hostState {
	hs, ok := p.owner[name]
	if !ok || !visible(hosts, hs.host.Name) {
		return nil
	}
	return hs
}

// pathKey is the key a visible tool reads its path from, for the approval
// gate's subject (approval.PathKeyUnknown for a tool no visible host
// serves).
func (p *Pipeline) pathKey(hosts []string, name string) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	hs := p.ownerLocked(hosts, name)
	if hs == nil {
		return approval.PathKeyUnknown
	}
	return hs.pathKeys[name]
}

// Schemas returns the schemas visible to a session, in lexicographic order.
// The slice and the schemas are shared (every step of every session with
// the same visible hosts gets the same ones until a host's tools change)
// and must not be mutated.
func (p *Pipeline) Schemas(hosts []string) []*llmv1.ToolSchema {
	key := hostsKey(hosts)
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.schemaMu.Lock()
	defer p.schemaMu.Unlock()
	if p.schemaGen != p.gen || p.schemas == nil {
		p.schemas, p.schemaGen = map[string][]*llmv1.ToolSchema{}, p.gen
	}
	if out, ok := p.schemas[key]; ok {
		return out
	}
	names := make([]string, 0, len(p.owner))
	for n, hs := range p.owner {
		if visible(hosts, hs.host.Name) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	out := make([]*llmv1.ToolSchema, 0, len(names))
	for _, n := range names {
		out = append(out, proto.CloneOf(p.owner[n].tools[n].GetSchema()))
	}
	out = out[:len(out):len(out)] // an append by a caller copies
	if len(p.schemas) < maxSchemaLists {
		p.schemas[key] = out
	}
	return out
}

// hostsKey encodes a visible-host list exactly (no two lists share a key;
// nil and empty, which mean the same, do).
func hostsKey(hosts []string) string {
	var b strings.Builder
	for _, h := range hosts {
		b.WriteString(strconv.Itoa(len(h)))
		b.WriteByte(':')
		b.WriteString(h)
	}
	return b.String()
}

// maxSchemaLists bounds the schema cache: sessions choose their visible
// hosts, so the lists are few in practice but not bounded by the server.
const maxSchemaLists = 64

// PrepareCalls classifies a batch: one PreparedCall per execution, in order.
// Tools that are always safe are parallel without a round trip; per-call
// tools ask their host; anything unknown or failing is exclusive. A batch
// of one remote call is asked on a PrepareExecute stream that stays open
// for the call (under ctx, which must outlive the batch): Begin takes it,
// and Release ends it for a call never begun.
func (p *Pipeline) PrepareCalls(ctx context.Context, hosts []string, execs []*toolsv1.ToolExecution) []*toolsv1.PreparedCall {
	out := make([]*toolsv1.PreparedCall, len(execs))
	ask := map[*hostState][]int{}
	for i, ex := range execs {
		out[i] = &toolsv1.PreparedCall{CallId: ex.GetCallId(), Mode: toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE}
		hs, d := p.lookup(hosts, ex.GetName())
		if hs == nil {
			continue
		}
		if hs.host.Local == nil {
			ask[hs] = append(ask[hs], i)
		}
		if d.GetConcurrency() == toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS {
			out[i].Mode = toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL
		}
	}
	for hs, idx := range ask {
		if len(execs) == 1 && !hs.noPrepareExecute.Load() {
			// One call: prepared on the stream that will execute it.
			pc, served := p.prepareExecute(ctx, hs, execs[0])
			if served {
				if pc != nil {
					p.apply(hosts, execs, out, 0, pc)
				}
				continue
			}
		}
		req := &toolsv1.PrepareCallsRequest{}
		for _, i := range idx {
			req.Executions = append(req.Executions, execs[i])
		}
		cctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
		resp, err := hs.host.Client.PrepareCalls(cctx, req)
		cancel()
		if err != nil || len(resp.GetCalls()) != len(idx) {
			p.log.Debug("prepare calls failed; using descriptor modes", "host", hs.host.Name, "err", err)
			continue
		}
		for k, i := range idx {
			p.apply(hosts, execs, out, i, resp.GetCalls()[k])
		}
	}
	return out
}

// apply takes a host's answer pc for execs[i] into out[i].
func (p *Pipeline) apply(hosts []string, execs []*toolsv1.ToolExecution, out []*toolsv1.PreparedCall, i int, pc *toolsv1.PreparedCall) {
	_, d := p.lookup(hosts, execs[i].GetName())
	if d.GetConcurrency() != toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_UNSPECIFIED {
		out[i].Mode = pc.GetMode()
	}
	out[i].View = pc.GetView()
}
