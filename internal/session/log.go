package session

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// Option configures a [Log].
type Option func(*options)

type options struct {
	now     func() time.Time
	logger  *slog.Logger
	strict  bool
	trusted bool
}

// WithClock sets the clock that stamps events appended with time 0
// (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithLogger sets the logger that reports observer panics (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithTurnChecks makes [Log.Append] also enforce the turn-enclosure
// invariant and the call/result trace of [Checker] (the debug check of
// semantics.md §3.8). Without it Append enforces only the per-event and
// surface rules; NewLog always checks the seed fully.
func WithTurnChecks() Option { return func(o *options) { o.strict = true } }

// WithTrustedSeed tells [NewLog] that the seed already passed [CheckLog] on
// its way in and is handed over to the log: NewLog then neither checks it
// again nor clones it, and only rebuilds the derived state (surface, model
// history, folded request header, turn state), exactly as it would for an
// untrusted seed. It still refuses a seed whose seqs are not 0, 1, ... or
// that holds a nil event.
//
// Use it only for a log a persistence Store has just loaded (every Store
// runs CheckLog in Load, see internal/persistence) and that the caller
// neither keeps nor mutates afterwards. Any other seed, one received from a
// client above all, must go through the full check.
func WithTrustedSeed() Option { return func(o *options) { o.trusted = true } }

// Log is the append-only event log of one session and its derived state:
// the surface, the cached model history and the folded request header. It is
// safe for concurrent use. Events handed out by a Log are shared and must not
// be mutated.
type Log struct {
	opts   options
	header *sessionv1.SessionHeader

	mu      sync.RWMutex
	events  []*sessionv1.SessionEvent
	surf    surface
	turns   turns
	reqHdr  *sessionv1.EpochHeader
	reqSeq  int64
	hdrTok  int64       // the meter's estimate of reqHdr's envelope
	anchor  usageAnchor // the meter's usage baseline
	set     settingsFold
	obsMu   sync.Mutex
	obs     []*observer
	queue   []*sessionv1.SessionEvent
	sending bool
}

type observer struct {
	fn      func(*sessionv1.SessionEvent)
	stopped bool // guarded by Log.obsMu
}

// NewLog returns a log holding the seed events (which must have seqs 0, 1,
// ... and pass [CheckLog]) under the immutable session header h. The seed is
// cloned and checked, unless [WithTrustedSeed] says a Store already checked
// it. A seed may end inside an open turn (a crashed session); the caller
// repairs it by appending [InterruptedTurnClosers].
func NewLog(h *sessionv1.SessionHeader, seed []*sessionv1.SessionEvent, opts ...Option) (*Log, error) {
	l := &Log{opts: options{now: time.Now}}
	for _, o := range opts {
		o(&l.opts)
	}
	if l.opts.logger == nil {
		l.opts.logger = slog.New(slog.DiscardHandler)
	}
	if h != nil {
		l.header = proto.CloneOf(h)
	}
	l.surf.derive = true
	l.reqSeq = -1
	l.set = newSettingsFold(l.header)
	l.events = make([]*sessionv1.SessionEvent, 0, max(len(seed), 64))
	if l.opts.trusted {
		for i, ev := range seed {
			switch {
			case ev == nil:
				return nil, fmt.Errorf("session: trusted seed: %w", &InvariantError{Seq: int64(i), Rule: "the seed holds a nil event"})
			case ev.GetSeq() != int64(i):
				return nil, fmt.Errorf("session: trusted seed: %w", &InvariantError{Seq: int64(i), Type: TypeName(ev), Rule: fmt.Sprintf("seq must be %d (contiguous from 0), got %d", i, ev.GetSeq())})
			}
			l.commit(ev)
		}
		return l, nil
	}
	var c Checker
	for _, ev := range seed {
		ev = cloneEvent(ev)
		if err := c.Check(ev); err != nil {
			return nil, fmt.Errorf("session: seed: %w", err)
		}
		l.commit(ev)
	}
	return l, nil
}

// commit adds a validated event; l.mu must be held (or l unpublished).
func (l *Log) commit(ev *sessionv1.SessionEvent) {
	l.events = append(l.events, ev)
	if IsSurfaceEvent(ev) {
		l.surf.apply(ev)
	}
	l.turns.apply(ev)
	if rh := ev.GetRequestHeader(); rh != nil {
		l.reqHdr, l.reqSeq = canonicalShared(rh.GetHeader()), ev.GetSeq()
		l.hdrTok = EstimateHeader(l.reqHdr)
	}
	l.noteUsage(ev)
	l.set.apply(ev)
}

// Append validates a copy of ev, assigns its seq (the log length; a non-zero
// seq must equal it) and its time (now, when 0), commits it, and then
// notifies the observers. It returns the logged event. A rejected event
// leaves the log unchanged and yields an [*AppendError] naming the event's
// type and the broken rule.
func (l *Log) Append(ev *sessionv1.SessionEvent) (*sessionv1.SessionEvent, error) {
	// Copying and the content walk need no log state: do them unlocked.
	want := ev.GetSeq()
	ev, content := cloneAndCheck(ev)
	return l.append(ev, want, content)
}

// AppendOwned is [Log.Append] for an event built for the log alone, handed
// over: the log keeps ev itself instead of a copy, and sets its seq and
// time. The same rules apply, and a rejected ev is left as it was. Neither
// ev nor any message it references may be mutated afterwards, by anyone:
// the log hands them out as shared.
func (l *Log) AppendOwned(ev *sessionv1.SessionEvent) (*sessionv1.SessionEvent, error) {
	want, at := ev.GetSeq(), ev.GetTime()
	out, err := l.append(ev, want, checkEvent(ev))
	if err != nil {
		ev.Seq, ev.Time = want, at
	}
	return out, err
}

// append commits ev (the log's own), whose content rule is content, as the
// event at seq want (0: the next).
func (l *Log) append(ev *sessionv1.SessionEvent, want int64, content string) (*sessionv1.SessionEvent, error) {
	l.mu.Lock()
	seq := int64(len(l.events))
	if want != 0 && want != seq {
		l.mu.Unlock()
		return nil, &AppendError{Seq: seq, Type: TypeName(ev), Rule: fmt.Sprintf("seq %d leaves a gap or rewrites history: the next seq is %d", want, seq)}
	}
	ev.Seq = seq
	if ev.Time == 0 {
		ev.Time = l.opts.now().UnixMilli()
	}
	if rule := l.rule(ev, content); rule != "" {
		l.mu.Unlock()
		return nil, &AppendError{Seq: seq, Type: TypeName(ev), Rule: rule}
	}
	l.commit(ev)
	l.mu.Unlock()
	l.notify(ev)
	return ev, nil
}

func (l *Log) rule(ev *sessionv1.SessionEvent, content string) string {
	if r := checkShape(ev); r != "" {
		return r
	}
	if content != "" {
		return content
	}
	if IsSurfaceEvent(ev) {
		if r := l.surf.checkOp(ev, l.events); r != "" {
			return r
		}
	}
	if l.opts.strict {
		return l.turns.check(ev, len(l.events) == 0)
	}
	return ""
}

// notify delivers ev to the observers. Deliveries are serialised in commit
// order: if another delivery is running (another appender, or an observer
// that appended), ev is queued and delivered by it.
func (l *Log) notify(ev *sessionv1.SessionEvent) {
	l.obsMu.Lock()
	if len(l.obs) == 0 && !l.sending {
		l.obsMu.Unlock()
		return
	}
	l.queue = append(l.queue, ev)
	if l.sending {
		l.obsMu.Unlock()
		return
	}
	l.sending = true
	for i := 0; i < len(l.queue); i++ { // the queue may grow while unlocked
		next := l.queue[i]
		l.queue[i] = nil
		obs := l.obs
		l.obsMu.Unlock()
		for _, o := range obs {
			l.deliver(o, next)
		}
		l.obsMu.Lock()
	}
	l.queue = l.queue[:0]
	l.sending = false
	l.obsMu.Unlock()
}

func (l *Log) deliver(o *observer, ev *sessionv1.SessionEvent) {
	l.obsMu.Lock()
	stopped := o.stopped
	l.obsMu.Unlock()
	if stopped {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			l.opts.logger.Error("session: observer panicked", "seq", ev.GetSeq(), "type", TypeName(ev), "panic", r)
		}
	}()
	o.fn(ev)
}

// Observe registers fn to be called with every event committed from now on,
// in seq order, after the event is committed. fn runs on an appending
// goroutine, must not block for long, and may itself append (its event is
// delivered after the current one). A panic in fn is logged and contained.
// stop unregisters fn: no delivery starts after stop returns (one already
// running on another goroutine may still be finishing).
func (l *Log) Observe(fn func(*sessionv1.SessionEvent)) (stop func()) {
	o := &observer{fn: fn}
	l.obsMu.Lock()
	l.obs = append(l.obs[:len(l.obs):len(l.obs)], o) // copy on write: deliveries iterate a snapshot
	l.obsMu.Unlock()
	return func() {
		l.obsMu.Lock()
		defer l.obsMu.Unlock()
		o.stopped = true
		obs := make([]*observer, 0, len(l.obs))
		for _, x := range l.obs {
			if x != o {
				obs = append(obs, x)
			}
		}
		l.obs = obs
	}
}

// Len returns the number of events, which is also the next seq.
func (l *Log) Len() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return int64(len(l.events))
}

// Events returns a read-only snapshot of the log. Later appends do not
// change it. O(1).
func (l *Log) Events() []*sessionv1.SessionEvent {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.events[:len(l.events):len(l.events)]
}

// EventsFrom returns a read-only snapshot of the events with seq >= seq
// (nil when seq is past the end, everything when seq <= 0).
func (l *Log) EventsFrom(seq int64) []*sessionv1.SessionEvent {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := int64(len(l.events))
	if seq >= n {
		return nil
	}
	return l.events[max(seq, 0):n:n]
}

// Header returns the session header given to [NewLog] (nil if none). It must
// not be mutated.
func (l *Log) Header() *sessionv1.SessionHeader { return l.header }

// Messages returns the derived model history (semantics.md §3.6). The result
// is cached: after an append it costs O(1) amortised, after a replace one
// rebuild. The slice and messages are shared and must not be mutated;
// later appends do not change a returned slice.
func (l *Log) Messages() []*llmv1.Message {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.surf.msgs == nil {
		return []*llmv1.Message{}
	}
	return l.surf.msgs[:len(l.surf.msgs):len(l.surf.msgs)]
}

// Surface returns a copy of the surface's node seqs, in order, and the
// replace generation (the number of replaces applied so far).
func (l *Log) Surface() (nodes []int64, replaceGeneration int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return append([]int64(nil), l.surf.nodes...), l.surf.gen
}

// RequestHeader returns the canonical form of the latest request/header, or
// nil when none was logged. It must not be mutated.
func (l *Log) RequestHeader() *sessionv1.EpochHeader {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.reqHdr
}

// OpenTurn returns the number of the open turn, if one is open.
func (l *Log) OpenTurn() (turn int32, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.turns.turn, l.turns.turnOpen
}

// OpenStep returns the number of the open step, if one is open.
func (l *Log) OpenStep() (step int32, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.turns.step, l.turns.stepOpen
}

// NextTurn returns the number the next turn/start must carry.
func (l *Log) NextTurn() int32 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.turns.wantNextTurn()
}

// RequestHeaderSeq returns the seq of the latest request/header (-1 when
// none was logged).
func (l *Log) RequestHeaderSeq() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.reqSeq
}

// Settings returns the session's effective mutable settings (see
// [Settings]). The options are shared and must not be mutated.
func (l *Log) Settings() Settings {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.set.s
}

// Compacting reports whether a compaction holds the lock (a compact/start
// without its compact/end) and the seq of that compact/start.
func (l *Log) Compacting() (startSeq int64, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.turns.compactSeq, l.turns.compacting
}

// PendingRequests returns the approval and question requests of the open
// turn that are not settled yet, in the order they were asked. The slice is
// shared and must not be mutated.
func (l *Log) PendingRequests() []PendingRequest {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.turns.requests
}

// RequestsAsked returns how many approval/asked and question/asked events the
// log holds (request ids are numbered from it).
func (l *Log) RequestsAsked() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.turns.asked
}
