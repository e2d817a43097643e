// Package agent is the dsh agent service: it owns sessions, runs one loop
// driver per live session (services/agent/internal/loop), persists every
// session log through a Store, and serves dsh.agent.v1.AgentService.
//
// Sessions are loaded on demand: a command on a session that is persisted but
// not in memory loads it first (the Store repairs an interrupted turn), and a
// session that stayed quiescent, unobserved and unused for Config.IdleUnload
// is flushed and dropped from memory.
//
// # Delivery
//
// Events are appended to the in-memory log synchronously; the log itself is
// the write-behind buffer. flush appends every event past the session's
// durable cursor as one Store batch, at the loop's checkpoints (after every
// turn/end, before each model request and each tool body), after an idle
// injection, after a fork, at unload and at Close. After each successful flush
// the new events are handed to Config.Sink, in seq order, exactly once per
// flush; a failed flush keeps them for the next one.
//
// # Shutdown
//
// Close stops admission (new commands fail with Unavailable), lets running
// and queued turns finish until DrainReserve before its context's deadline,
// then disposes what is left (the open turn ends as disposed;
// queued sends that never ran are logged by session and count), ends every
// event stream, and flushes every session.
package agent

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/agent/internal/agenttools"
	"github.com/dsh-dev/dsh/services/agent/internal/approval"
	"github.com/dsh-dev/dsh/services/agent/internal/compact"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/idem"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
	"github.com/dsh-dev/dsh/services/agent/internal/progress"
	"github.com/dsh-dev/dsh/services/agent/internal/subagent"
	"github.com/dsh-dev/dsh/services/agent/internal/title"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

// Store is the persistence the service uses (a subset of
// persistence.Store). Load must honour persistence.Store's contract,
// including that the log it returns (closers included) passed
// session.CheckLog: the service seeds its session.Log with
// session.WithTrustedSeed and does not check the log again.
type Store interface {
	Create(ctx context.Context, h *sessionv1.SessionHeader) error
	Append(ctx context.Context, id string, events []*sessionv1.SessionEvent) error
	Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error)
	List(ctx context.Context) ([]*sessionv1.SessionHeader, error)
}

// ProviderLister lists the gateway's provider routes.
type ProviderLister interface {
	ListProviders(ctx context.Context) ([]string, error)
}

// EventSink receives events once they are durable, in seq order per session,
// and status transitions. tenant is the session's SessionHeader.tenant ("" is
// the default tenant); the NATS sink puts it in the subject. Implementations
// must not block.
type EventSink interface {
	Durable(tenant, sessionID string, events []*sessionv1.SessionEvent)
	Status(tenant, sessionID string, status agentv1.AgentStatus)
}

// encodedSink is a sink that takes the events' protobuf encodings along
// (the store made them: persistence.EncodingAppender), so it need not
// encode each event again (the NATS publisher publishes them as they are).
// pb[i] encodes events[i]; the sink must not modify the bytes.
type encodedSink interface {
	DurableEncoded(tenant, sessionID string, events []*sessionv1.SessionEvent, pb [][]byte)
}

// createdSink is a sink that wants to know of a session just created in
// the store (the NATS publisher then skips reading its published cursor).
type createdSink interface {
	Created(tenant, sessionID string)
}

// catchUpper is a sink that can publish, by itself, what the store holds
// beyond what it has published (the NATS publisher).
type catchUpper interface {
	CatchUp(headers ...*sessionv1.SessionHeader)
}

// Config holds the service's settings.
type Config struct {
	// IdleUnload drops sessions quiescent and unused this long; 0 never.
	IdleUnload time.Duration
	// MaxParallelToolCalls bounds overlapping parallel-safe calls; default 10.
	MaxParallelToolCalls int
	// Debug runs the invariant and request-equation checks on every request.
	Debug bool
	// DefaultCwd is the cwd of sessions created without one.
	DefaultCwd string
	// MaxQueuedItems and MaxQueuedBytes bound one session's inbox (queued
	// sends and steering); zero takes loop.DefaultMaxQueuedItems and
	// loop.DefaultMaxQueuedBytes, negative is unbounded.
	MaxQueuedItems int
	MaxQueuedBytes int64
	// ProcessMaxQueuedItems and ProcessMaxQueuedBytes bound the inboxes of
	// every session together; zero or negative is unbounded.
	ProcessMaxQueuedItems int
	ProcessMaxQueuedBytes int64
	// Sandbox is the deployment's default confinement (--sandbox-mode,
	// --sandbox-network); nil sends no policy (hosts apply their own).
	Sandbox *toolsv1.SandboxPolicy
	// HandedOff, when set, is called during Close for each session retired
	// early because it was idle when the drain began (flushed, disposed):
	// a replica releases its lease so another replica takes its next call
	// instead of forwarding it here for the rest of the drain.
	HandedOff func(ctx context.Context, sessionID string)
	// Sink receives durable events; nil for none.
	Sink EventSink
	// Approval holds the deployment's approval defaults. The zero value is
	// on_request with no deployment rules (every call runs unless the
	// session's own rules say otherwise) and no deadline.
	Approval ApprovalConfig
	// MaxSubagentDepth is the deepest delegation allowed (a top-level
	// session is depth 0, its children 1); 0 takes
	// subagent.DefaultMaxDepth, negative forbids delegation.
	MaxSubagentDepth int32
	// ReplyCache bounds the in-memory cache of first replies to commands
	// with a request_id (default 4096); the session log stays the authority.
	ReplyCache int
	// Compaction is the agent's compaction policy (zero fields take the
	// defaults of semantics.md §7.6); the gateway's per-route/model
	// overrides apply on top. NoCompaction turns the token meter's triggers
	// and the Compact RPC off.
	Compaction   compact.Policy
	NoCompaction bool
	// Now and NewID are injected for reproducible logs; defaults time.Now
	// and random hex ids.
	Now   func() time.Time
	NewID func() string
}

// Deps are the service's collaborators.
type Deps struct {
	Store     Store          // required
	LLM       loop.LLM       // required
	Providers ProviderLister // nil: provider names are not validated
	Tools     loop.Tools     // nil: no tools
	Hooks     *hooks.Set     // nil: no hooks
	Prompt    loop.SystemPrompt
	Workspace loop.Workspace // nil: no workspace context
	Titles    *title.Titler  // nil: sessions are not titled
	// Approvers are remote Approver services consulted before a person.
	Approvers []approval.Remote
}

// ApprovalConfig is the deployment's approval settings (semantics.md §7.3).
type ApprovalConfig struct {
	// Policy applies to sessions that set none; unset means on_request.
	Policy sessionv1.ApprovalPolicy
	// Rules are evaluated after each session's own rules.
	Rules []*sessionv1.ApprovalRule
	// Timeout settles a request nobody answered as unavailable; 0: never.
	Timeout time.Duration
}

// DefaultApprovalRules are the shipped deployment rules: calls that change
// files or run commands (write, edit, bash) ask; everything else runs.
func DefaultApprovalRules() []*sessionv1.ApprovalRule {
	ask := sessionv1.RuleAction_RULE_ACTION_ASK
	return []*sessionv1.ApprovalRule{{Tool: "bash", Action: ask}, {Tool: "write", Action: ask}, {Tool: "edit", Action: ask}}
}

// ParseApprovalPolicy parses "never", "on-request", "always".
func ParseApprovalPolicy(s string) (sessionv1.ApprovalPolicy, error) {
	p, ok := approval.ParsePolicy(s)
	if !ok {
		return 0, fmt.Errorf("approval policy %q: use never, on-request or always", s)
	}
	return p, nil
}

// ParseApprovalFlags builds the deployment's approval settings from the
// agent's flags: a policy name, rules in the flag form (none: the
// DefaultApprovalRules) and the answer deadline.
func ParseApprovalFlags(policy string, rules []string, timeout time.Duration) (ApprovalConfig, error) {
	p, err := ParseApprovalPolicy(policy)
	if err != nil {
		return ApprovalConfig{}, err
	}
	if timeout < 0 {
		return ApprovalConfig{}, fmt.Errorf("approval timeout must not be negative, got %s", timeout)
	}
	c := ApprovalConfig{Policy: p, Timeout: timeout, Rules: DefaultApprovalRules()}
	if len(rules) > 0 {
		c.Rules = nil
		for _, s := range rules {
			r, err := ParseApprovalRule(s)
			if err != nil {
				return ApprovalConfig{}, err
			}
			c.Rules = append(c.Rules, r)
		}
	}
	return c, nil
}

// ParseApprovalRule parses TOOL[(PATTERN)]=allow|ask|deny.
func ParseApprovalRule(s string) (*sessionv1.ApprovalRule, error) { return approval.ParseRule(s) }

// Service is the agent service.
type Service struct {
	agentv1.UnimplementedAgentServiceServer

	cfg     Config
	deps    Deps
	log     *slog.Logger
	metrics *telemetry.Metrics // step time (stepmetrics.go); nil records nothing

	appr *approval.Config

	mu      sync.Mutex
	live    map[string]*liveSession
	loading map[string]chan struct{}
	closing bool // admission closed: no new session, turn or compaction
	ending  bool // Close has begun
	closed  chan struct{}
	stop    context.CancelFunc
	budget  *loop.ProcessBudget
	replies *idem.Cache[proto.Message] // first replies of commands with a request_id
	wg      sync.WaitGroup

	// kids are the running subagent children by parent; sub serves the
	// delegation tools (nil when the deployment wires none).
	kids kids
	sub  *subagent.Host

	compactor *compact.Compactor // nil: compaction off

	// progressSubs counts the StreamEvents streams of every session that
	// follow live tool progress: with none, a tool's output chunk costs no
	// lookup under mu.
	progressSubs atomic.Int64
}

// New returns a service.
func New(cfg Config, deps Deps, logger *slog.Logger) (*Service, error) {
	if deps.Store == nil || deps.LLM == nil {
		return nil, errors.New("agent: Deps.Store and Deps.LLM are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NewID == nil {
		cfg.NewID = randomID
	}
	if err := approval.ValidateRules("deployment approval rules", cfg.Approval.Rules); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, deps: deps, log: logger, live: map[string]*liveSession{},
		loading: map[string]chan struct{}{}, closed: make(chan struct{}),
		budget:  loop.NewProcessBudget(cfg.ProcessMaxQueuedItems, cfg.ProcessMaxQueuedBytes),
		replies: idem.New[proto.Message](cmp.Or(cfg.ReplyCache, defaultReplyCache)),
		appr: &approval.Config{Policy: cfg.Approval.Policy, Rules: cfg.Approval.Rules, Timeout: cfg.Approval.Timeout,
			Approvers: deps.Approvers, Logger: logger}}
	s.metrics, _ = telemetry.NewMetrics(nil)
	s.compactor = newCompactor(cfg, deps, s)
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	if cfg.IdleUnload > 0 {
		s.wg.Go(func() { s.janitor(ctx) })
	}
	return s, nil
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Register registers AgentService on gs.
func (s *Service) Register(gs *grpc.Server) { agentv1.RegisterAgentServiceServer(gs, s) }

// liveSession is a session in memory.
type liveSession struct {
	s     *Service
	id    string
	log   *session.Log
	agent *loop.Agent
	gate  *approval.Gate

	flushMu sync.Mutex
	durable atomic.Int64 // next seq not yet durable; written under flushMu
	steps   stepTimer    // under flushMu (stepmetrics.go)

	subMu sync.Mutex
	subs  map[chan struct{}]struct{}
	// dropped is closed when Drop takes the session away (another replica
	// owns it): its followers end instead of waiting for events that will
	// be appended elsewhere.
	dropped chan struct{}

	progress *progress.Hub // live tool output for StreamEvents (not durable)
	usage    usageSum      // the log's token usage, folded as it grows

	stopTitle func()

	// Guarded by Service.mu.
	refs     int
	lastUsed time.Time
}

// open builds the live session of log and starts its driver.
func (s *Service) open(ctx context.Context, log *session.Log, durable int64, source string) *liveSession {
	l := &liveSession{s: s, id: log.Header().GetId(), log: log, subs: map[chan struct{}]struct{}{}, progress: progress.NewHub(),
		dropped: make(chan struct{})}
	l.durable.Store(durable)
	log.Observe(func(*sessionv1.SessionEvent) { l.notify() })
	l.gate = approval.NewGate(s.appr, log, l.flush)
	l.agent = loop.New(loop.Config{
		LLM: s.deps.LLM, Tools: s.toolsFor(log.Header()), Hooks: s.deps.Hooks, Prompt: s.deps.Prompt, Workspace: s.deps.Workspace,
		Flush: l.flush, MaxParallelToolCalls: s.cfg.MaxParallelToolCalls, Debug: s.cfg.Debug, Logger: s.log, Approval: l.gate,
		Limits: loop.QueueLimits{MaxItems: s.cfg.MaxQueuedItems, MaxBytes: s.cfg.MaxQueuedBytes, Process: s.budget}, Sandbox: s.cfg.Sandbox,
		Context: s.contextManager(),
		OnStatus: func(st agentv1.AgentStatus) {
			if s.cfg.Sink != nil {
				s.cfg.Sink.Status(log.Header().GetTenant(), l.id, st)
			}
		},
	}, log)
	l.stopTitle = func() {}
	if s.deps.Titles != nil {
		// Record joins the open turn or writes a zero-step turn, flushed
		// (semantics.md §7.11: appendOutOfBand); the title call has no
		// request context.
		l.stopTitle = s.deps.Titles.Watch(log, func(ev *sessionv1.SessionEvent) error {
			_, err := l.agent.Record(context.Background(), titleTrigger(), ev)
			return err
		})
	}
	l.agent.Start(ctx, source)
	return l
}

func (l *liveSession) notify() {
	l.subMu.Lock()
	defer l.subMu.Unlock()
	for ch := range l.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (l *liveSession) subscribe() (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.subMu.Lock()
	l.subs[ch] = struct{}{}
	l.subMu.Unlock()
	return ch, func() {
		l.subMu.Lock()
		delete(l.subs, ch)
		l.subMu.Unlock()
	}
}

// flush appends every event past the durable cursor as one batch and hands
// them to the sink.
func (l *liveSession) flush(ctx context.Context) error {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	from := l.durable.Load()
	evs := l.log.EventsFrom(from)
	if len(evs) == 0 {
		return nil
	}
	pb, err := persistence.AppendLogged(ctx, l.s.deps.Store, l.id, evs)
	if err != nil {
		return fmt.Errorf("flush session %s from seq %d: %w", l.id, from, err)
	}
	l.durable.Store(evs[len(evs)-1].GetSeq() + 1)
	l.steps.observe(l.s.metrics, l.log.Settings().Options, evs)
	if sink := l.s.cfg.Sink; sink != nil {
		if es, ok := sink.(encodedSink); ok { // it drops encodings that do not match evs
			es.DurableEncoded(l.log.Header().GetTenant(), l.id, evs, pb)
		} else {
			sink.Durable(l.log.Header().GetTenant(), l.id, evs)
		}
	}
	return nil
}

// acquireAny returns the live session id, loading it from the store when it
// is persisted but not in memory, whatever its tenant (use acquire for
// requests). release must be called when done.
func (s *Service) acquireAny(ctx context.Context, id string) (*liveSession, error) {
	if id == "" {
		return nil, invalidf("session_id is required")
	}
	l, unmark, err := s.reserve(ctx, id, func(l *liveSession) { l.refs++ })
	if err != nil || l != nil {
		return l, err
	}
	defer unmark()
	l, err = s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closing {
		// Admission closed while it loaded: Close takes its sessions
		// without this one, so it must not join them (a turn started
		// in it would run on after the store closed).
		s.mu.Unlock()
		s.retire(context.WithoutCancel(ctx), l)
		return nil, ErrClosing
	}
	l.refs++
	s.live[id] = l
	s.mu.Unlock()
	return l, nil
}

// reserve waits until no load or create of id runs. Then either the id is
// live: reserve returns its session (after onLive, if given, ran on it under
// s.mu); or it marks the id loading and returns unmark, to be called once
// the caller made the session live or gave up, which lets the waiters on
// the id go on. One load or create of an id runs at a time, so a load
// never races a create of the same id, and a create retried while the first
// runs finds its session live.
func (s *Service) reserve(ctx context.Context, id string, onLive func(*liveSession)) (live *liveSession, unmark func(), err error) {
	for {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return nil, nil, ErrClosing
		}
		if l, ok := s.live[id]; ok {
			if onLive != nil {
				onLive(l)
			}
			s.mu.Unlock()
			return l, nil, nil
		}
		wait, ok := s.loading[id]
		if !ok {
			break // s.mu held
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	done := make(chan struct{})
	s.loading[id] = done
	s.mu.Unlock()
	return nil, func() {
		s.mu.Lock()
		delete(s.loading, id)
		s.mu.Unlock()
		close(done)
	}, nil
}

// acquire returns the live session id for the principal of ctx (see
// acquireAny): a session of another tenant is ErrSessionNotFound with exactly
// the message of a session that does not exist (no existence oracle).
// release must be called when done.
//
// When the store can read a header alone (persistence.Reader), a session
// that is not in memory is vetted by its stored header before it is loaded,
// so another tenant's session is answered after the same one-row lookup a
// missing session gets, and is never loaded (or repaired) on a stranger's
// request; another tenant's live session pays that lookup too.
func (s *Service) acquire(ctx context.Context, id string) (*liveSession, error) {
	if id == "" {
		return nil, invalidf("session_id is required")
	}
	p := principalOf(ctx)
	if hr, ok := s.deps.Store.(headerReader); ok {
		s.mu.Lock()
		l, live := s.live[id]
		if live {
			l.refs++
		}
		s.mu.Unlock()
		if live {
			if p.CanSee(l.log.Header().GetTenant()) {
				return l, nil
			}
			s.release(l)
			_, _ = hr.ReadHeader(ctx, id) // the lookup a missing session gets
			return nil, notFound(id)
		}
		h, err := hr.ReadHeader(ctx, id)
		switch {
		case errors.Is(err, persistence.ErrNotFound):
			// Neither live a moment ago nor stored: a session created
			// since is answered as if this request came first.
			return nil, notFound(id)
		case err != nil:
			return nil, fmt.Errorf("read session %s: %w", id, err)
		case !p.CanSee(h.GetTenant()):
			return nil, notFound(id)
		}
	}
	l, err := s.acquireAny(ctx, id)
	if err != nil {
		if errors.Is(err, persistence.ErrNotFound) {
			return nil, notFound(id)
		}
		return nil, err
	}
	if !p.CanSee(l.log.Header().GetTenant()) {
		s.release(l)
		return nil, notFound(id)
	}
	return l, nil
}

// headerReader is the part of persistence.Reader acquire uses.
type headerReader interface {
	ReadHeader(ctx context.Context, id string) (*sessionv1.SessionHeader, error)
}

// notFound is the one error of a session the caller cannot see, whether it
// does not exist or belongs to another tenant.
func notFound(id string) error { return fmt.Errorf("session %q: %w", id, ErrSessionNotFound) }

// principalOf is the caller's principal; a context without one (the
// service used without its gRPC edge, which always sets one) is the local
// principal of --auth none.
func principalOf(ctx context.Context) auth.Principal {
	if p, ok := auth.FromContext(ctx); ok {
		return p
	}
	return auth.Local()
}

func (s *Service) load(ctx context.Context, id string) (*liveSession, error) {
	h, evs, err := s.deps.Store.Load(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("load session %s: %w", id, err)
	}
	// Sessions stored before tenancy belong to the default tenant.
	h.Tenant = auth.TenantOf(h.GetTenant())
	// The store validated the log on its way in (see Store): validate once.
	log, err := session.NewLog(h, evs, append(s.logOptions(), session.WithTrustedSeed())...)
	if err != nil {
		return nil, fmt.Errorf("load session %s: stored log is invalid: %w", id, err)
	}
	s.log.Info("session loaded", "session", id, "events", len(evs))
	// Load may have appended repair events (an interrupted turn closed)
	// that no flush hands to the sink: let it publish what the store holds
	// beyond its cursor. A replica's catch-up at claim time runs before the
	// repair, so it cannot be relied on for them.
	if cu, ok := s.cfg.Sink.(catchUpper); ok {
		cu.CatchUp(h)
	}
	l := s.open(ctx, log, int64(len(evs)), "resume")
	l.closeOrphanedStarts(ctx) // subagent.go
	return l, nil
}

func (s *Service) release(l *liveSession) {
	s.mu.Lock()
	l.refs--
	l.lastUsed = s.cfg.Now()
	s.mu.Unlock()
}

// janitor unloads idle sessions.
func (s *Service) janitor(ctx context.Context) {
	every(ctx, max(s.cfg.IdleUnload/4, 10*time.Millisecond), func() { s.unloadIdle(ctx) })
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}

func (s *Service) unloadIdle(ctx context.Context) {
	now := s.cfg.Now()
	var victims []*liveSession
	s.mu.Lock()
	for id, l := range s.live {
		if l.refs == 0 && now.Sub(l.lastUsed) >= s.cfg.IdleUnload && l.unloadable() {
			delete(s.live, id)
			victims = append(victims, l)
		}
	}
	s.mu.Unlock()
	for _, l := range victims {
		s.retire(ctx, l)
	}
}

// Unload drops a session from memory now if it is quiescent and unused; it
// reports whether it did.
func (s *Service) Unload(ctx context.Context, id string) bool {
	s.mu.Lock()
	l, ok := s.live[id]
	if !ok || l.refs > 0 || !l.unloadable() {
		s.mu.Unlock()
		return false
	}
	delete(s.live, id)
	s.mu.Unlock()
	s.retire(ctx, l)
	return true
}

// unloadable reports whether the session can leave memory: quiescent, and
// with a log the store holds (a session with no events yet exists only in
// memory: the store materialises a session at its first append).
func (l *liveSession) unloadable() bool {
	return l.agent.Quiescent() && l.log.Len() > 0 && l.durableSeq() == l.log.Len() && !l.s.kids.has(l.id)
}

// retire disposes a live session's agent and flushes it.
func (s *Service) retire(ctx context.Context, l *liveSession) {
	if s.sub != nil {
		s.sub.DisposeSession(ctx, l.id) // its background subagents first
	}
	l.stopTitle()
	dropped, err := l.agent.Dispose(ctx)
	if err != nil {
		s.log.Error("dispose session", "session", l.id, "err", err)
	}
	if len(dropped) > 0 {
		s.log.Warn("queued prompts were not run before shutdown", "session", l.id, "count", len(dropped))
	}
	if err := l.flush(context.WithoutCancel(ctx)); err != nil {
		s.log.Error("final flush failed", "session", l.id, "err", err)
	}
	if f, ok := s.deps.LLM.(interface{ Forget(sessionID string) }); ok {
		f.Forget(l.id)
	}
	// Background tasks die with their session: the toolhosts kill them now.
	if e, ok := s.deps.Tools.(sessionEnder); ok {
		e.EndSession(context.WithoutCancel(ctx), l.id)
	}
}

// sessionEnder is the part of the tools that releases a session's
// toolhost-side state (background tasks) when it leaves the agent.
type sessionEnder interface {
	EndSession(ctx context.Context, sessionID string)
}

// refuseNew closes admission ahead of Close: from now on new sessions,
// turns and compactions are refused (UNAVAILABLE) while running turns go
// on. A drain calls it before readiness turns NOT_SERVING, so a client
// that sees NOT_SERVING is refused too; Close does it as well.
func (s *Service) refuseNew() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
}

// Close stops admission, lets turns finish during the first half of the time
// left before ctx's deadline, disposes what is left (in parallel), ends event
// streams and flushes every session.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.ending {
		s.mu.Unlock()
		return nil
	}
	s.ending, s.closing = true, true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait() // the janitor ended: no session is unloaded behind the list below
	s.mu.Lock()
	lives := make([]*liveSession, 0, len(s.live))
	for _, l := range s.live {
		lives = append(lives, l)
	}
	s.mu.Unlock()

	// Sessions idle when the drain begins (no turn, nothing queued, no
	// running subagent, not a subagent themselves) leave at once: admission
	// is closed, so nothing can start in them any more.
	var idle []*liveSession
	busy := lives[:0:0]
	for _, l := range lives {
		if l.agent.Status() == agentv1.AgentStatus_AGENT_STATUS_IDLE && l.agent.Queued() == 0 &&
			!s.kids.has(l.id) && l.log.Header().GetSubagent() == nil {
			idle = append(idle, l)
		} else {
			busy = append(busy, l)
		}
	}
	idleErrs := s.retireAll(ctx, idle, s.cfg.HandedOff)
	lives = busy

	// Running and queued turns may finish until DrainReserve before the
	// deadline; the reserve disposes what is left and flushes.
	drainCtx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithDeadline(ctx, dl.Add(-DrainReserve(time.Until(dl))))
		defer cancel()
	}
	var wg sync.WaitGroup
	for _, l := range lives {
		wg.Go(func() { _ = l.agent.WaitIdle(drainCtx) })
	}
	wg.Wait()
	if s.deps.Titles != nil {
		s.deps.Titles.Close()
	}
	close(s.closed)
	errs := s.retireAll(ctx, lives, nil)
	s.mu.Lock()
	s.live = map[string]*liveSession{}
	s.mu.Unlock()
	return errors.Join(append(idleErrs, errs...)...)
}

// retireAll retires sessions in parallel; then, for each one whose events
// are all durable, calls after (when set).
func (s *Service) retireAll(ctx context.Context, lives []*liveSession, after func(context.Context, string)) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(lives))
	for i, l := range lives {
		wg.Go(func() {
			s.retire(ctx, l)
			if n := l.log.Len() - l.durableSeq(); n > 0 {
				errs[i] = fmt.Errorf("session %s: %d events not durable", l.id, n)
				return
			}
			if after != nil {
				after(ctx, l.id)
			}
		})
	}
	wg.Wait()
	return errs
}

func (l *liveSession) durableSeq() int64 { return l.durable.Load() }

// snapshot is the API view of a live session.
func (l *liveSession) snapshot() *agentv1.Session {
	set := l.log.Settings()
	out := &agentv1.Session{Header: l.log.Header(), Status: l.agent.Status(), NextSeq: l.log.Len(), Queued: int32(l.agent.Queued()),
		Title: set.Title, EffectiveOptions: set.Options, RunningChildren: l.s.kids.of(l.id)}
	out.Usage, out.ChildrenUsage = l.usage.of(l.log.Events())
	if t, ok := l.log.OpenTurn(); ok {
		out.OpenTurn = &t
	}
	for _, r := range l.log.PendingRequests() {
		p := &agentv1.PendingRequest{Id: r.ID, Seq: r.Event.GetSeq()}
		if a := r.Event.GetApprovalAsked(); a != nil {
			p.Kind = &agentv1.PendingRequest_Approval{Approval: a}
		} else {
			p.Kind = &agentv1.PendingRequest_Question{Question: r.Event.GetQuestionAsked()}
		}
		out.Pending = append(out.Pending, p)
	}
	return out
}

// gateOf is the approval gate of a live session (the toolpipe's Gates).
func (s *Service) gateOf(id string) toolpipe.Gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.live[id]; ok {
		return l.gate
	}
	return nil
}

// publishProgress hands a running call's live output to the StreamEvents
// subscribers of its session (include_progress); it never blocks.
func (s *Service) publishProgress(ex *toolsv1.ToolExecution, out *toolsv1.ToolOutput) {
	if s.progressSubs.Load() == 0 {
		return
	}
	id := ex.GetContext().GetSessionId()
	s.mu.Lock()
	l, ok := s.live[id]
	s.mu.Unlock()
	if !ok || !l.progress.Active() {
		return
	}
	l.progress.Publish(&agentv1.ToolProgress{
		Turn: ex.GetContext().GetTurn(), Step: ex.GetContext().GetStep(), CallId: ex.GetCallId(), ToolName: ex.GetName(),
		Output: out, AfterSeq: l.log.Len() - 1,
	})
}

// askerOf is the question channel of a live session (agent-side tools).
func (s *Service) askerOf(id string) agenttools.Asker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.live[id]; ok {
		return l.gate
	}
	return nil
}

// sortedIDs merges stored and live ids.
func (s *Service) headers(ctx context.Context) ([]*sessionv1.SessionHeader, map[string]*liveSession, error) {
	stored, err := s.deps.Store.List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list sessions: %w", err)
	}
	s.mu.Lock()
	live := make(map[string]*liveSession, len(s.live))
	for id, l := range s.live {
		live[id] = l
	}
	s.mu.Unlock()
	seen := map[string]bool{}
	var out []*sessionv1.SessionHeader
	for _, h := range stored {
		seen[h.GetId()] = true
		out = append(out, h)
	}
	for id, l := range live {
		if !seen[id] {
			out = append(out, l.log.Header())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return out, live, nil
}

func (s *Service) logOptions() []session.Option {
	opts := []session.Option{session.WithClock(s.cfg.Now), session.WithLogger(s.log)}
	if s.cfg.Debug {
		opts = append(opts, session.WithTurnChecks())
	}
	return opts
}
