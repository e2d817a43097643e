package compact

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/internal/session"
)

// CheckpointSource is the message source plugin of the checkpoint
// user/message a compaction appends.
const CheckpointSource = "compact"

// CheckpointPreamble opens the checkpoint; the summary follows in
// <compacted-summary> tags.
const CheckpointPreamble = "This session continues from an earlier part of the conversation that was compacted to save context. " +
	"The summary below replaces it; the messages after it are verbatim."

// Instruction is the final user message of a summarization call.
const Instruction = "Summarize the conversation above for your own later use; it will replace those messages in your context. " +
	"Keep what is needed to continue the work: the user's requests and constraints, decisions made and why, files and " +
	"commands involved with their important results, errors met and how they were solved, and what remains to do. " +
	"Be concise and factual. Reply with the summary text only: no tool calls, no preamble."

// Errors of a compaction.
var (
	// ErrInProgress: a compact/start without compact/end holds the lock.
	ErrInProgress = errors.New("a compaction is already in progress")
	// ErrNothingToCompact: no eligible region (too little context, or
	// everything is the recent tail).
	ErrNothingToCompact = errors.New("nothing to compact: the context holds no older whole exchange outside the recent tail")
	// ErrNoRequest: the session made no model request yet, so there is no
	// route, system prompt or tool list to summarize with.
	ErrNoRequest = errors.New("nothing to compact: the session has not made a model request yet")
)

// NotShrinkingError: the summary would not be smaller than what it
// replaces.
type NotShrinkingError struct{ Summary, Shadowed int64 }

func (e *NotShrinkingError) Error() string {
	return fmt.Sprintf("the summary (%d tokens) does not shrink the %d tokens it would replace", e.Summary, e.Shadowed)
}

// LLM is the model seam (the gateway client).
type LLM interface {
	Generate(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error]
}

// Models reports a route/model's context window and compaction overrides
// (the gateway's GetModelContext); a nil context means unknown.
type Models interface {
	ModelContext(ctx context.Context, provider, model string) (*llmv1.ModelContext, error)
}

// Session is one session as a compaction sees it: its log, the appender
// that serialises with the session's other writers, the durability
// checkpoint (nil: none) and the open turn.
type Session struct {
	Log    *session.Log
	Append func(*sessionv1.SessionEvent) (*sessionv1.SessionEvent, error)
	Flush  func(context.Context) error
	Turn   int32
}

// Result is one finished compaction.
type Result struct {
	StartSeq, SummarySeq, CheckpointSeq, EndSeq int64
	Summary                                     string
	Start, End                                  int64 // the replaced inclusive surface span (seqs)
	ShadowedSeqs                                []int64
	ShadowedTokens                              int64
	Pruned                                      []Pruned
}

// Reading is a measurement against the model's window.
type Reading struct {
	session.Measurement
	// Window is the context window; 0 when unknown.
	Window int64
	Policy Policy
}

// Ratio is TotalTokens / Window, or false when the window is unknown.
func (r Reading) Ratio() (float64, bool) {
	if r.Window <= 0 {
		return 0, false
	}
	return float64(r.TotalTokens) / float64(r.Window), true
}

// Compactor runs compactions for every session of an agent.
type Compactor struct {
	llm    LLM
	models Models
	base   Policy
	lg     *slog.Logger

	mu    sync.Mutex
	cache map[[2]string]cached
	now   func() time.Time
}

type cached struct {
	mc *llmv1.ModelContext
	at time.Time
}

// modelTTL bounds how long a route's context is cached (routes change only
// with the gateway's configuration).
const modelTTL = 5 * time.Minute

// New returns a Compactor; base is the agent's policy (zero fields take the
// defaults), models may be nil (windows unknown: only overflow recovery and
// manual compaction run).
func New(llm LLM, models Models, base Policy, logger *slog.Logger) *Compactor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Compactor{llm: llm, models: models, base: base, lg: logger, cache: map[[2]string]cached{}, now: time.Now}
}

// route is the provider/model the meter measures against: the latest
// request header's, else the session's options.
func route(log *session.Log) (provider, model string) {
	if h := log.RequestHeader(); h != nil {
		return h.GetConfig().GetProvider(), h.GetConfig().GetModel()
	}
	o := log.Settings().Options
	return o.GetProvider(), o.GetModel()
}

func (c *Compactor) modelContext(ctx context.Context, provider, model string) *llmv1.ModelContext {
	if c.models == nil || provider == "" || model == "" {
		return nil
	}
	key := [2]string{provider, model}
	c.mu.Lock()
	e, ok := c.cache[key]
	c.mu.Unlock()
	if ok && c.now().Sub(e.at) < modelTTL {
		return e.mc
	}
	mc, err := c.models.ModelContext(ctx, provider, model)
	if err != nil {
		// Cached too: a gateway that cannot say is not asked every step.
		c.lg.Warn("model context unavailable; the window is unknown", "provider", provider, "model", model, "err", err)
		mc = nil
	}
	c.mu.Lock()
	c.cache[key] = cached{mc: mc, at: c.now()}
	c.mu.Unlock()
	return mc
}

// Read measures log against its route's window.
func (c *Compactor) Read(ctx context.Context, log *session.Log) Reading {
	p, m := route(log)
	mc := c.modelContext(ctx, p, m)
	return Reading{Measurement: log.Measure(), Window: mc.GetContextWindow(), Policy: c.base.override(mc.GetCompaction()).withDefaults()}
}

// AfterStep is the pressure trigger (agent/post-step): when the measured
// total reaches the threshold of a known window it prunes, remeasures and,
// if still over, compacts. It returns the result, or nil when nothing ran.
func (c *Compactor) AfterStep(ctx context.Context, s Session) (*Result, error) {
	r := c.Read(ctx, s.Log)
	if r.Window <= 0 || r.Policy.Disabled || r.TotalTokens < r.Policy.threshold(r.Window) {
		return nil, nil
	}
	if _, held := s.Log.Compacting(); held {
		return nil, nil
	}
	res, err := c.relieve(ctx, s, r, sessionv1.CompactTrigger_COMPACT_TRIGGER_PRESSURE)
	if errors.Is(err, ErrNothingToCompact) {
		return nil, nil
	}
	return res, err
}

// Recover is the overflow trigger (CONTEXT_WINDOW_EXCEEDED): prune, then
// compact unless pruning alone brought the estimate under the threshold.
// retry reports whether the surface changed (its replace generation
// advanced; pruning alone counts), so the step is worth retrying once.
func (c *Compactor) Recover(ctx context.Context, s Session) (retry bool, err error) {
	r := c.Read(ctx, s.Log)
	if r.Policy.Disabled {
		return false, nil
	}
	if _, held := s.Log.Compacting(); held {
		return false, nil
	}
	before := r.ReplaceGeneration
	_, err = c.relieve(ctx, s, r, sessionv1.CompactTrigger_COMPACT_TRIGGER_CONTEXT_OVERFLOW)
	if errors.Is(err, ErrNothingToCompact) {
		err = nil
	}
	return s.Log.Measure().ReplaceGeneration > before, err
}

// relieve prunes, then compacts if pressure remains (always for an
// overflow that pruning did not touch).
func (c *Compactor) relieve(ctx context.Context, s Session, r Reading, trigger sessionv1.CompactTrigger) (*Result, error) {
	var pruned []Pruned
	if !r.Policy.PruneDisabled {
		var err error
		if pruned, err = Prune(s, r.Policy); err != nil {
			return nil, err
		}
		if len(pruned) > 0 {
			r = c.Read(ctx, s.Log)
			if r.Window > 0 && r.TotalTokens < r.Policy.threshold(r.Window) {
				return nil, nil
			}
		}
	}
	res, err := c.run(ctx, s, r, trigger, nil)
	if res != nil {
		res.Pruned = pruned
	}
	return res, err
}

// minPressureRegion is the smallest region a pressure compaction replaces:
// below it the checkpoint (preamble and summary) would not pay for itself,
// and the pressure comes from the envelope or the recent tail, which no
// compaction can shrink.
const minPressureRegion = 256

// Span is an explicit inclusive surface span (seqs of surface nodes).
type Span struct{ Start, End int64 }

// Compact is a manual compaction: of span, or of the whole eligible
// region when span is nil. It prunes first (the result says what).
func (c *Compactor) Compact(ctx context.Context, s Session, span *Span) (*Result, error) {
	if _, held := s.Log.Compacting(); held {
		return nil, ErrInProgress
	}
	r := c.Read(ctx, s.Log)
	var pruned []Pruned
	if span == nil && !r.Policy.PruneDisabled {
		var err error
		if pruned, err = Prune(s, r.Policy); err != nil {
			return nil, err
		}
		r = c.Read(ctx, s.Log)
	}
	res, err := c.run(ctx, s, r, sessionv1.CompactTrigger_COMPACT_TRIGGER_MANUAL, span)
	if res != nil {
		res.Pruned = pruned
	}
	if err != nil && len(pruned) > 0 && errors.Is(err, ErrNothingToCompact) {
		return &Result{Pruned: pruned}, nil
	}
	return res, err
}

// selectRegion picks what to compact.
func (c *Compactor) selectRegion(s Session, r Reading, span *Span, trigger sessionv1.CompactTrigger) (region, error) {
	manual := trigger == sessionv1.CompactTrigger_COMPACT_TRIGGER_MANUAL
	u := surfaceUnits(s.Log)
	if span != nil {
		return u.selectSpan(span.Start, span.End)
	}
	window := r.Window
	if window <= 0 || manual {
		// Unknown window, or a manual compaction (which should not find
		// everything "recent" on a large window): keep the tail's share of
		// what is there now.
		window = r.TotalTokens
	}
	// The summarization call replays the region with the same envelope;
	// it must fit the window itself.
	var budget int64
	if r.Window > 0 {
		budget = r.Window*9/10 - r.HeaderTokens - session.EstimateMessage(instructionMessage())
	}
	reg, ok := u.selectOldest(r.Policy.retain(window), budget)
	if !ok || (trigger == sessionv1.CompactTrigger_COMPACT_TRIGGER_PRESSURE && reg.tokens < minPressureRegion) {
		return region{}, ErrNothingToCompact
	}
	return reg, nil
}

func instructionMessage() *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{session.Text(Instruction)}}
}

// run is the protocol: compact/start, the summarization call (with
// retries), re-validation, compact/summary, the checkpoint, compact/end
// (also on failure). Cancellation wins: the compaction ends with an error
// and nothing is replaced.
func (c *Compactor) run(ctx context.Context, s Session, r Reading, trigger sessionv1.CompactTrigger, span *Span) (*Result, error) {
	hdr := s.Log.RequestHeader()
	if hdr == nil {
		return nil, ErrNoRequest
	}
	reg, err := c.selectRegion(s, r, span, trigger)
	if err != nil {
		return nil, err
	}
	turn := s.Turn
	start, err := s.Append(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactStart{CompactStart: &sessionv1.CompactStart{
		Turn: &turn, Trigger: trigger}}})
	if err != nil {
		if _, held := s.Log.Compacting(); held {
			return nil, ErrInProgress
		}
		return nil, fmt.Errorf("compact/start: %w", err)
	}
	// compact/start is durable before the call, like every model request:
	// a crash from here on leaves an orphan that repair closes.
	var res *Result
	if s.Flush != nil {
		err = s.Flush(context.WithoutCancel(ctx))
	}
	if err == nil {
		res, err = c.summarizeAndReplace(ctx, s, hdr, r.Policy, reg)
	}
	end := &sessionv1.CompactEnd{Turn: &turn}
	if err != nil {
		end.Error = err.Error()
		if ctx.Err() != nil {
			end.Error = "cancelled: " + context.Cause(ctx).Error()
			err = fmt.Errorf("compaction cancelled: %w", context.Cause(ctx))
		}
	}
	ev, aerr := s.Append(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: end}})
	if aerr != nil {
		return nil, errors.Join(err, fmt.Errorf("compact/end: %w", aerr))
	}
	if err != nil {
		return nil, err
	}
	res.StartSeq, res.EndSeq = start.GetSeq(), ev.GetSeq()
	return res, nil
}

func (c *Compactor) summarizeAndReplace(ctx context.Context, s Session, hdr *sessionv1.EpochHeader, p Policy, reg region) (*Result, error) {
	shadowed := shadowedMessages(s.Log, reg)
	provider := cmp.Or(p.Provider, hdr.GetConfig().GetProvider())
	model := cmp.Or(p.Model, hdr.GetConfig().GetModel())
	msgs := make([]*llmv1.Message, 0, len(hdr.GetMessagePrefix())+len(shadowed)+1)
	msgs = append(append(append(msgs, hdr.GetMessagePrefix()...), shadowed...), instructionMessage())
	req := &llmv1.GenerateRequest{Provider: provider, Model: model, System: hdr.System, Tools: hdr.GetTools(), Messages: msgs,
		MaxTokens: proto.Int32(p.MaxTokens), Purpose: llmv1.Purpose_PURPOSE_COMPACTION, SessionId: s.Log.Header().GetId()}
	var summary string
	var checkpoint []*llmv1.ContentBlock
	var errs []error
	for attempt := 0; attempt <= p.Retries; attempt++ {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		text, err := c.summarize(ctx, req)
		if err == nil {
			checkpoint = checkpointContent(text)
			got := session.EstimateMessage(&llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: checkpoint})
			if got >= reg.tokens {
				err = &NotShrinkingError{Summary: got, Shadowed: reg.tokens}
			}
		}
		if err == nil {
			summary = text
			break
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt+1, err))
		c.lg.Warn("compaction summary rejected", "session", s.Log.Header().GetId(), "attempt", attempt+1, "err", err)
	}
	if summary == "" {
		return nil, errors.Join(errs...)
	}
	// Re-validate: the selected nodes must still be the surface there
	// (unrelated log-only appends are fine, a replace is not).
	nodes, gen := s.Log.Surface()
	if gen != reg.gen || len(nodes) < reg.to || !slices.Equal(nodes[reg.from:reg.to], reg.seqs) {
		return nil, errors.New("the surface changed during the summarization; nothing was replaced")
	}
	first, last := reg.seqs[0], reg.seqs[len(reg.seqs)-1]
	sum := &sessionv1.CompactSummary{Summary: summary, ShadowedRange: &sessionv1.SurfaceReplace{Start: first, End: last},
		ShadowedSeqs: reg.seqs, ShadowedTokenCount: reg.tokens, Provider: provider, Model: model, MaxTokens: proto.Int32(p.MaxTokens)}
	sev, err := s.Append(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactSummary{CompactSummary: sum}})
	if err != nil {
		return nil, fmt.Errorf("compact/summary: %w", err)
	}
	um := session.UserMessageEvent(checkpoint, session.PluginSource(CheckpointSource))
	um.SurfaceOp, um.SourceEventSeqs = session.ReplaceOp(first, last), session.Seqs(reg.seqs...)
	cev, err := s.Append(um)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return &Result{SummarySeq: sev.GetSeq(), CheckpointSeq: cev.GetSeq(), Summary: summary, Start: first, End: last,
		ShadowedSeqs: reg.seqs, ShadowedTokens: reg.tokens}, nil
}

// shadowedMessages returns the region's messages as the log's own cached
// (shared) messages when the surface is still the selected one, so the
// summarization request repeats the conversation's leading messages by
// identity (the gateway client reuses their encoding) and by bytes (the
// provider's prompt cache); else freshly derived ones.
func shadowedMessages(log *session.Log, reg region) []*llmv1.Message {
	events := log.Events()
	msgs := log.Messages()
	nodes, gen := log.Surface()
	if gen == reg.gen && len(nodes) >= reg.to && slices.Equal(nodes[reg.from:reg.to], reg.seqs) {
		i := 0 // messages before the region
		for _, seq := range nodes[:reg.from] {
			if session.DeriveEventMessage(events[seq]) != nil {
				i++
			}
		}
		n := 0
		for _, seq := range reg.seqs {
			if session.DeriveEventMessage(events[seq]) != nil {
				n++
			}
		}
		if i+n <= len(msgs) {
			return msgs[i : i+n : i+n]
		}
	}
	var out []*llmv1.Message
	for _, seq := range reg.seqs {
		if m := session.DeriveEventMessage(events[seq]); m != nil {
			out = append(out, m)
		}
	}
	return out
}

// summarize makes one summarization call and keeps only its text.
func (c *Compactor) summarize(ctx context.Context, req *llmv1.GenerateRequest) (string, error) {
	var asm llmstream.Assembler
	for chunk, err := range c.llm.Generate(ctx, req) {
		if err != nil {
			return "", fmt.Errorf("summarization call: %w", err)
		}
		asm.Push(chunk)
	}
	f := asm.Finish()
	if fe := f.GetError(); fe != nil {
		return "", fmt.Errorf("summarization call failed: %s: %s", fe.GetFailure().GetCode(), fe.GetFailure().GetMessage())
	}
	if fa := f.GetAborted(); fa != nil {
		return "", fmt.Errorf("summarization call aborted: %s", fa.GetFailure().GetMessage())
	}
	if f == nil {
		return "", errors.New("summarization call ended without a finish")
	}
	m, err := asm.Message()
	if err != nil {
		return "", fmt.Errorf("summarization call: %w", err)
	}
	var sb strings.Builder
	for _, b := range m.GetContent() {
		if t := b.GetText(); t != nil {
			sb.WriteString(t.GetText())
		}
	}
	text := strings.TrimSpace(sb.String())
	if text == "" {
		return "", errors.New("the summarization call returned no text")
	}
	return text, nil
}

func checkpointContent(summary string) []*llmv1.ContentBlock {
	return []*llmv1.ContentBlock{session.Text(CheckpointPreamble + "\n\n<compacted-summary>\n" + summary + "\n</compacted-summary>")}
}
