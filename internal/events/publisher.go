// Package events fans session events out over NATS: every durable event goes
// to the JetStream stream DSH_EVENTS on subject
// dsh.events.<tenant>.<session_id>, and every live status change (idle,
// running) to core NATS on dsh.status.<tenant>.<session_id>, so NATS
// permissions can scope a consumer to one tenant (dsh.events.<tenant>.>).
// All subjects, headers and message ids are built in subjects.go and nowhere
// else; tenant and session id are each encoded to exactly one subject token.
//
// The agent hands events to a Publisher (its EventSink) only after they are
// durable. Durable and Status never block: they append to a per-session queue
// that one publisher goroutine drains, in rounds over every session with
// something queued.
//
// # Delivery
//
// JetStream ends up with every event of a session exactly once, in seq order
// (but for the gap named below):
//
//   - a durable per-session published cursor (the next seq not yet known to
//     be in JetStream) is kept in the session store and advanced only after
//     JetStream acknowledged everything below it;
//   - every message carries Nats-Msg-Id <session_id>:<seq>, so a re-publish
//     inside the stream's duplicate window is dropped by the server;
//   - before publishing a session for the first time, and after any failure,
//     the publisher reads the last message stored on the session's subject
//     and moves the cursor past its seq, so a re-publish after a crash or a
//     long outage is skipped even outside the duplicate window;
//   - publishes of every session share one pipeline (up to
//     Config.BatchSize waiting for their acknowledgements; pipeline.go) on
//     one connection with the reconnect buffer off, so a message is never
//     replayed after a later one. A refused publish (JetStream's error
//     reply) fails its session alone: it is resumed from that event, and the
//     others go on. A missing acknowledgement (AckTimeout) or a lost
//     connection fails every publish still waiting in the window, of every
//     session: each is resumed from its cursor.
//
// After a refusal, a session's events go into the window one at a time
// until one is acknowledged, so its retries cannot leave a gap. One gap
// remains, on a session's first refusal: when JetStream refuses an event
// but stores a later one of the same session that was already in the
// window with it (the stream's limits changed between the two), the resync
// moves the cursor past the stream's tail and so past the refused event,
// which is then missing from the stream (the store keeps it); a warning
// names the session and the seqs.
//
// When NATS is unreachable the queues hold the events, up to Config.QueueLimit
// per session; beyond that the newest events are dropped from memory and read
// again from the store (when it implements Reader) or handed in again by the
// agent, which passes the whole loaded log to Durable when it loads a session
// (events below the cursor are skipped; a re-handed log is kept whole). The
// connection retries forever.
//
// Status messages are at most once: they are not persisted, and are dropped
// while NATS is unreachable. A session's status is published after the
// events queued before it, so a subscriber that sees IDLE finds every event
// of the finished turn in the stream.
//
// # Shutdown
//
// Close publishes what it can until its context ends, then drains the
// connection. Events left unpublished stay behind the durable cursor and are
// published after the next start.
package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// Defaults.
const (
	DefaultQueueLimit = 1 << 16
	DefaultBatchSize  = 256
	DefaultAckTimeout = 5 * time.Second
	// DefaultDuplicates is the stream's duplicate window when dsh creates it.
	DefaultDuplicates = 2 * time.Minute
	maxStatusQueue    = 16
	// DefaultHeldEncodings is Config.HeldEncodings when unset.
	DefaultHeldEncodings = 8 << 20
	closeGrace           = time.Second
	minBackoff           = 50 * time.Millisecond
	maxBackoff           = 2 * time.Second
)

// Cursors is the durable published cursor of each session (the persistence
// Store implements it).
type Cursors interface {
	// PublishedCursor returns the next seq not yet published; 0 when none
	// was. A session never stored may return an error; it is treated as 0.
	PublishedCursor(ctx context.Context, id string) (int64, error)
	// SetPublishedCursor records that every event below next was published.
	SetPublishedCursor(ctx context.Context, id string, next int64) error
}

// CursorBatch is implemented by stores that write many sessions' published
// cursors in one write (the SQLite store: one request of one commit). The
// publisher then saves every moved cursor in one call instead of one call —
// and one wait for a commit — per session. errs[i] is the result of
// raising ids[i]'s cursor to next[i].
type CursorBatch interface {
	SetPublishedCursors(ctx context.Context, ids []string, next []int64) (errs []error)
}

// Reader reads a stored log from a seq without modifying it. When the store
// given in Config implements it, the publisher fills gaps (events dropped
// from a full queue, or left unpublished by a previous process) by itself;
// otherwise it waits for the agent to hand them in again.
type Reader interface {
	ReadEvents(ctx context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error)
}

// Config configures a Publisher.
type Config struct {
	// Conn says how to reach NATS.
	Conn Conn
	// Store keeps the published cursors. Required.
	Store Cursors
	// Logger receives connection and publish problems. Required.
	Logger *slog.Logger
	// Metrics records the publish lag; nil means instruments on the global
	// meter provider (a no-op unless telemetry.Setup installed one).
	Metrics *telemetry.Metrics
	// QueueLimit bounds the events queued in memory per session.
	QueueLimit int
	// BatchSize is how many publishes, of all sessions, may wait for their
	// acknowledgements at once (the pipeline's window).
	BatchSize int
	// AckTimeout bounds the wait for the next acknowledgement while
	// publishes wait for theirs; past it they are all failed and published
	// again from the cursors.
	AckTimeout time.Duration
	// Replicas is the replica count used when dsh creates the stream.
	Replicas int
	// Limits bound the stream (set at creation, and on an existing stream
	// whose limits differ); zero fields leave it unbounded or as it is.
	Limits StreamLimits
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// CursorEvery bounds how often a session's cursor is written to the
	// store (the stream's tail corrects a stale cursor on the next start);
	// 0 means 200ms. Close writes every cursor.
	CursorEvery time.Duration
	// HeldEncodings bounds the bytes of handed-in encodings (DurableEncoded)
	// the queues hold at once: past it an event is queued without its bytes
	// and marshalled when it is published, so a publisher that falls behind
	// holds at most this much more than the events themselves. 0 means
	// DefaultHeldEncodings; negative holds none.
	HeldEncodings int
	// ExtraOptions are appended to the NATS options (tests use it).
	ExtraOptions []nats.Option
}

// Publisher publishes session events and statuses to NATS.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	reader Reader
	batch  CursorBatch // the store's, when it writes cursors in batches

	wake    chan struct{}
	closing chan struct{}
	done    chan struct{}

	mu       sync.Mutex
	held     int // bytes of the encodings queued (queued.pb), at most cfg.HeldEncodings
	sessions map[string]*sessionState
	dirty    map[string]struct{}
	busy     bool   // publishDirty is running
	connGen  uint64 // bumped on every (re)connect
	streamAt uint64 // connGen at which the stream was last ensured
	// stream is the handle ensureStream got (nil before): streamTail asks it
	// for a session's last message without a stream-info round trip each.
	stream jetstream.Stream
	// conn ends when the connection is lost (connDown), so a stream
	// look-up whose reply will never come stops waiting (lookupCtx).
	conn     context.Context
	connDown context.CancelFunc

	// Used by the publishing goroutine (run) only.
	win      *window
	lost     chan struct{} // poked on a disconnect: replies owed are lost
	roundErr error         // the first error of a session that failed in the round (settle)
	taken    []queued      // nextBatch's copy of a queue's events, reused
}

type queued struct {
	ev *sessionv1.SessionEvent
	pb []byte // the event's protobuf encoding when the store handed it over, else nil
	at time.Time
}

type sessionState struct {
	id         string
	tenant     string // the session's tenant ("" is DefaultTenant); set at creation, immutable
	subject    string // EventSubject(tenant, id), made once
	tenantTok  string // TenantToken(tenant), made once
	cursor     int64  // next seq to publish; -1 until read from the store
	next       int64  // one past the highest seq ever queued; -1 when none
	pending    []queued
	overflowed bool   // the queue overflowed (logged once)
	sweep      bool   // read the store beyond the cursor (CatchUp)
	sweeps     uint64 // CatchUp calls so far: a read that found nothing ends only the sweeps it began after
	resync     bool   // consult the stream's tail before publishing
	saved      int64
	statuses   []agentv1.AgentStatus

	// The session's part in the publishing round (run's goroutine only).
	inflight int                   // its events in the window
	open     bool                  // publishSession is putting its events into the window
	failErr  error                 // why one of its events was not acknowledged
	refused  int64                 // seq of its event JetStream refused, to be resynced past; -1 when none
	probe    bool                  // JetStream refused one of its events: the next goes into the window alone
	ready    []agentv1.AgentStatus // statuses to publish once its events in the window are acknowledged
}

// New validates the options and starts a Publisher. A bad option is an
// *OptionError naming the flag; an unreachable server is not an error: the
// publisher logs a warning, keeps the events queued and retries.
func New(ctx context.Context, cfg Config) (*Publisher, error) {
	if cfg.Store == nil {
		return nil, errors.New("events: Config.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.QueueLimit <= 0 {
		cfg.QueueLimit = DefaultQueueLimit
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		if m, err := telemetry.NewMetrics(nil); err == nil {
			cfg.Metrics = m
		}
	}
	if cfg.HeldEncodings == 0 {
		cfg.HeldEncodings = DefaultHeldEncodings
	}
	if cfg.CursorEvery <= 0 {
		cfg.CursorEvery = 200 * time.Millisecond
	}
	opts, err := cfg.Conn.Options()
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "events"),
		wake:     make(chan struct{}, 1),
		closing:  make(chan struct{}),
		done:     make(chan struct{}),
		sessions: map[string]*sessionState{},
		dirty:    map[string]struct{}{},
		win:      newWindow(cfg.BatchSize),
		lost:     make(chan struct{}, 1),
	}
	p.conn, p.connDown = context.WithCancel(context.Background())
	p.reader, _ = cfg.Store.(Reader)
	p.batch, _ = cfg.Store.(CursorBatch)
	opts = append(opts,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		// No reconnect buffer: a publish during an outage fails at once
		// instead of being replayed after later ones.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(nc *nats.Conn) { p.connected(nc, "connected") }),
		nats.ReconnectHandler(func(nc *nats.Conn) { p.connected(nc, "reconnected") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			p.mu.Lock()
			p.connDown()
			p.mu.Unlock()
			select {
			case p.lost <- struct{}{}:
			default:
			}
			if err != nil {
				p.log.Warn("nats disconnected; events stay queued", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			p.log.Warn("nats error", "err", err)
		}),
	)
	opts = append(opts, cfg.ExtraOptions...)
	nc, err := nats.Connect(cfg.Conn.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("events: connect %s: %w", cfg.Conn.URL, err)
	}
	if !nc.IsConnected() {
		p.log.Warn("nats unreachable at start; serving anyway, events queue on the durable cursor and the connection keeps retrying",
			"url", cfg.Conn.URL)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("events: jetstream: %w", err)
	}
	p.nc, p.js = nc, js
	go p.run()
	p.poke() // create the stream as soon as the server is reachable
	return p, nil
}

func (p *Publisher) connected(nc *nats.Conn, what string) {
	p.log.Info("nats "+what, "url", nc.ConnectedUrlRedacted())
	p.mu.Lock()
	p.connGen++
	if p.conn.Err() != nil { // lost since: a new one for this connection
		p.conn, p.connDown = context.WithCancel(context.Background())
	}
	for id, s := range p.sessions {
		s.resync = true
		if len(s.pending) > 0 || s.next > s.cursor || s.sweep {
			p.dirty[id] = struct{}{}
		}
	}
	p.mu.Unlock()
	p.poke()
}

func (p *Publisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// state returns the session's state; a non-empty tenant names the session's
// tenant (fixed for its lifetime: the header's tenant never changes).
func (p *Publisher) state(id, tenant string) *sessionState {
	s := p.sessions[id]
	if s == nil {
		s = &sessionState{id: id, tenant: tenant, subject: EventSubject(tenant, id), tenantTok: TenantToken(tenant),
			cursor: -1, next: -1, saved: -1, refused: -1}
		p.sessions[id] = s
	}
	return s
}

// Durable queues durable events of a session of tenant ("" is
// DefaultTenant) for publishing. Events already queued or published are
// ignored, so the agent may hand in a whole loaded log after a restart. It
// never blocks.
func (p *Publisher) Durable(tenant, sessionID string, events []*sessionv1.SessionEvent) {
	p.durable(tenant, sessionID, events, nil)
}

// DurableEncoded is Durable for events whose protobuf encodings the store
// made as it stored them (persistence.EncodingAppender): pb[i] encodes
// events[i] and is published as the message body as it is, so no event is
// marshalled twice. The bytes must not be modified afterwards.
func (p *Publisher) DurableEncoded(tenant, sessionID string, events []*sessionv1.SessionEvent, pb [][]byte) {
	if len(pb) != len(events) {
		pb = nil
	}
	p.durable(tenant, sessionID, events, pb)
}

func (p *Publisher) durable(tenant, sessionID string, events []*sessionv1.SessionEvent, pb [][]byte) {
	if len(events) == 0 {
		return
	}
	now := p.cfg.Now()
	p.mu.Lock()
	s := p.state(sessionID, tenant)
	// Events handed in again (a loaded log after a restart, or after an
	// overflow) fill a gap and are kept whole: they are the agent's own
	// in-memory log, so holding them costs only the queue slots.
	rehand := events[0].GetSeq() < s.next
	// Encodings are admitted until the first that would pass the bound:
	// an encoding keeps its whole store row alive, so a later, smaller one
	// of the same call must not pin the row of one refused.
	admit := pb != nil
	for k, ev := range events {
		seq := ev.GetSeq()
		if s.cursor >= 0 && seq < s.cursor {
			continue
		}
		q := queued{ev: ev, at: now}
		if admit = admit && p.held+len(pb[k]) <= p.cfg.HeldEncodings; admit {
			q.pb = pb[k]
		}
		s.next = max(s.next, seq+1)
		n := len(s.pending)
		if n == 0 || seq > s.pending[n-1].ev.GetSeq() {
			s.pending = append(s.pending, q)
		} else {
			i, found := slices.BinarySearchFunc(s.pending, seq, func(q queued, seq int64) int { return cmp.Compare(q.ev.GetSeq(), seq) })
			if found {
				continue
			}
			s.pending = slices.Insert(s.pending, i, q)
		}
		p.held += len(q.pb)
		if len(s.pending) > p.cfg.QueueLimit && !rehand {
			// Keep the lowest seqs: they go out first. The dropped tail
			// stays below s.next and is read again (Reader) or handed in
			// again by the agent.
			if !s.overflowed {
				p.log.Warn("event queue full; dropping the newest events from memory until they can be read again",
					"session", sessionID, "limit", p.cfg.QueueLimit)
				s.overflowed = true
			}
			p.release(s.pending[p.cfg.QueueLimit:])
			clear(s.pending[p.cfg.QueueLimit:]) // no event or bytes held past len
			s.pending = s.pending[:p.cfg.QueueLimit]
		}
	}
	p.dirty[sessionID] = struct{}{}
	p.mu.Unlock()
	p.poke()
}

// Created tells the publisher that sessionID was just created in the store
// (its Create succeeded, so no stored session had the id and none of its
// events was ever published from this store): its first publication starts
// at seq 0 without reading the published cursor from the store. The
// stream's tail is still consulted first, as for every session's first
// publication, so messages an earlier store left on the subject are not
// published twice. A session the publisher already tracks is left as it is.
func (p *Publisher) Created(tenant, sessionID string) {
	p.mu.Lock()
	if s := p.state(sessionID, tenant); s.cursor < 0 {
		s.cursor, s.resync = 0, true
	}
	p.mu.Unlock()
}

// CatchUp asks the publisher to publish whatever the store holds beyond the
// published cursor of each stored session (after a restart); the headers
// name the sessions and their tenants. It needs a store that implements
// Reader; otherwise it does nothing.
func (p *Publisher) CatchUp(headers ...*sessionv1.SessionHeader) {
	if p.reader == nil {
		return
	}
	p.mu.Lock()
	for _, h := range headers {
		s := p.state(h.GetId(), h.GetTenant())
		s.sweep = true
		s.sweeps++
		p.dirty[h.GetId()] = struct{}{}
	}
	p.mu.Unlock()
	p.poke()
}

// Status queues a status change of a session of tenant for core NATS. It
// never blocks.
func (p *Publisher) Status(tenant, sessionID string, st agentv1.AgentStatus) {
	p.mu.Lock()
	s := p.state(sessionID, tenant)
	if len(s.statuses) >= maxStatusQueue {
		s.statuses = s.statuses[1:]
	}
	s.statuses = append(s.statuses, st)
	p.dirty[sessionID] = struct{}{}
	p.mu.Unlock()
	p.poke()
}

// release accounts for queued events leaving the queues (p.mu held).
func (p *Publisher) release(qs []queued) {
	for _, q := range qs {
		p.held -= len(q.pb)
	}
}

// Pending is the number of queued, unpublished events of every session.
func (p *Publisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.sessions {
		n += len(s.pending)
		if s.cursor >= 0 && s.next > s.cursor+int64(len(s.pending)) {
			n += int(s.next - s.cursor - int64(len(s.pending)))
		}
		if s.sweep {
			n++
		}
	}
	return n
}

// Flush waits until every queued event is published and the cursors are
// written, or ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		p.mu.Lock()
		clean := len(p.dirty) == 0 && !p.busy
		p.mu.Unlock()
		if clean && p.Pending() == 0 {
			p.saveCursors(ctx)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("events: flush: %d events unpublished: %w", p.Pending(), context.Cause(ctx))
		case <-t.C:
		}
	}
}

// Close publishes what it can until ctx ends (waiting at most a second for
// an unreachable server to come back), then drains and closes the
// connection. Events still unpublished stay behind the durable cursor.
func (p *Publisher) Close(ctx context.Context) error {
	// A server that is down does not hold the shutdown for the whole
	// deadline: wait a short grace for a reconnect, then leave the events
	// behind the cursor.
	gctx, cancel := context.WithTimeout(ctx, closeGrace)
	for !p.nc.IsConnected() && gctx.Err() == nil {
		select {
		case <-gctx.Done():
		case <-time.After(2 * time.Millisecond):
		}
	}
	cancel()
	var ferr error
	if p.nc.IsConnected() {
		ferr = p.Flush(ctx)
	} else if n := p.Pending(); n > 0 {
		ferr = fmt.Errorf("events: nats unreachable at close: %d events unpublished", n)
	}
	select {
	case <-p.closing:
	default:
		close(p.closing)
	}
	<-p.done
	if p.nc.IsConnected() {
		drained := make(chan struct{})
		p.nc.SetClosedHandler(func(*nats.Conn) { close(drained) })
		if err := p.nc.Drain(); err == nil {
			select {
			case <-drained:
			case <-ctx.Done():
			}
		}
	}
	p.nc.Close()
	if ferr != nil {
		p.log.Warn("events left unpublished at close; they are published after the next start", "err", ferr)
	}
	return ferr
}

func (p *Publisher) run() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := minBackoff
	var retry <-chan time.Time
	saveTick := time.NewTicker(p.cfg.CursorEvery)
	defer saveTick.Stop()
	defer p.saveCursors(context.Background())
	for {
		select {
		case <-p.closing:
			return
		case <-saveTick.C:
			p.saveCursors(ctx)
			continue
		case <-p.wake:
		case <-retry:
		}
		retry = nil
		if err := p.publishDirty(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Debug("publish failed; retrying", "err", err, "in", backoff)
			retry = time.After(backoff)
			backoff = min(backoff*2, maxBackoff)
			continue
		}
		backoff = minBackoff
	}
}

var errNotConnected = errors.New("events: nats not connected")

// publishDirty publishes every dirty session's queued events through the
// window (one pipeline across sessions, see pipeline.go) and then its
// statuses, and waits for every acknowledgement.
func (p *Publisher) publishDirty(ctx context.Context) error {
	if !p.nc.IsConnected() {
		return errNotConnected
	}
	sctx, cancel := lookupCtxOn(ctx, p.connCtx(), p.cfg.AckTimeout)
	err := p.ensureStream(sctx)
	cancel()
	if err != nil {
		return err
	}
	select {
	case <-p.lost: // a disconnect signalled before this round (the window is empty here): not this round's
		p.win.abandon()
	default:
	}
	if err := p.win.subscribe(p.nc); err != nil {
		return err
	}
	p.mu.Lock()
	ids := make([]string, 0, len(p.dirty))
	for id := range p.dirty {
		ids = append(ids, id)
	}
	clear(p.dirty)
	p.busy = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.busy = false
		p.mu.Unlock()
	}()
	p.roundErr = nil
	ready, firstErr := p.prepare(ctx, ids)
	// A session JetStream refused publishes one event at a time until one
	// is acknowledged, draining the window each time: last, so the
	// others' pipelining is not broken up by its waits.
	slices.SortStableFunc(ready, func(a, b *sessionState) int {
		switch {
		case a.probe == b.probe:
			return 0
		case a.probe:
			return 1
		}
		return -1
	})
	for i, s := range ready {
		if err := p.publishSession(ctx, s); err != nil {
			// The pipeline failed: what was not acknowledged is published
			// again from each session's cursor.
			p.mu.Lock()
			for _, rest := range ready[i:] {
				p.dirty[rest.id] = struct{}{}
			}
			p.mu.Unlock()
			return err
		}
	}
	if err := p.await(ctx, 0); err != nil {
		return err
	}
	return cmp.Or(firstErr, p.roundErr)
}

// connCtx is the context of the current connection: it ends when the
// connection is lost.
func (p *Publisher) connCtx() context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

// lookupCtxOn bounds a stream look-up like an acknowledgement: it fails
// after timeout (not the client's own 5 s default) or as soon as the
// connection conn is lost, when its reply never comes.
func lookupCtxOn(ctx, conn context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	stop := context.AfterFunc(conn, cancel)
	return ctx, func() { stop(); cancel() }
}

// tailLookups bounds the sessions whose cursors prepare reads at once.
const tailLookups = 16

// prepare returns the sessions of ids ready to publish: each one's cursor
// read from the store when it has none yet, and moved past the stream's
// tail when it must be resynced (first publication, after a failure). The
// lookups run side by side (a round trip to NATS each); a session whose
// lookup failed stays dirty and the first error is returned.
func (p *Publisher) prepare(ctx context.Context, ids []string) ([]*sessionState, error) {
	out := make([]*sessionState, 0, len(ids))
	var need []*sessionState
	p.mu.Lock()
	for _, id := range ids {
		if s := p.sessions[id]; s.cursor < 0 || s.resync {
			need = append(need, s)
		} else {
			out = append(out, s)
		}
	}
	p.mu.Unlock()
	errs := make([]error, len(need))
	if len(need) > 0 {
		// Each lookup has AckTimeout of its own (a batch of hundreds after
		// a reconnect takes longer than one round trip's bound).
		conn := p.connCtx()
		var wg sync.WaitGroup
		sem := make(chan struct{}, tailLookups)
		for i, s := range need {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				lctx, cancel := lookupCtxOn(ctx, conn, p.cfg.AckTimeout)
				defer cancel()
				errs[i] = p.resyncCursor(lctx, s)
			})
		}
		wg.Wait()
	}
	var firstErr error
	p.mu.Lock()
	for i, s := range need {
		if errs[i] != nil {
			p.dirty[s.id] = struct{}{}
			firstErr = cmp.Or(firstErr, errs[i])
			continue
		}
		out = append(out, s)
	}
	p.mu.Unlock()
	return out, firstErr
}

// resyncCursor sets the cursor of a session that has none from the store,
// and moves a cursor to be resynced past the stream's tail.
func (p *Publisher) resyncCursor(ctx context.Context, s *sessionState) error {
	p.mu.Lock()
	cursor, resync, tenant, refused := s.cursor, s.resync, s.tenant, s.refused
	p.mu.Unlock()
	if cursor < 0 {
		c, err := p.cfg.Store.PublishedCursor(ctx, s.id)
		if err != nil {
			c = 0 // never stored as published: start from the beginning (the stream's tail decides)
		}
		cursor, resync = c, true
	}
	if resync {
		tail, err := p.streamTail(ctx, tenant, s.id)
		if err != nil {
			p.mu.Lock()
			s.resync = true
			p.mu.Unlock()
			return err
		}
		if refused >= 0 && tail > cursor {
			// Later events of the session, in the window with the refused
			// one, were stored: the stream's tail passes the refused event,
			// which is skipped (the stream has a gap; the store has it).
			p.log.Warn("events: a refused event is skipped: later events of its session were stored after it",
				"session", s.id, "refused_seq", refused, "cursor", cursor, "stream_tail", tail)
		}
		cursor = max(cursor, tail)
	}
	p.mu.Lock()
	s.cursor, s.resync, s.refused = max(s.cursor, cursor), false, -1
	p.mu.Unlock()
	return nil
}

func (p *Publisher) ensureStream(ctx context.Context) error {
	p.mu.Lock()
	gen, done := p.connGen, p.streamAt == p.connGen && p.connGen != 0
	p.mu.Unlock()
	if done {
		return nil
	}
	st, err := p.js.Stream(ctx, StreamName)
	if err == nil {
		err = p.reconcileStream(ctx, st)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = p.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        StreamName,
			Description: "dsh session events, one subject per session",
			Subjects:    []string{AllEvents},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			Duplicates:  DefaultDuplicates,
			Replicas:    p.cfg.Replicas,
			MaxAge:      p.cfg.Limits.MaxAge,
			MaxBytes:    cmp.Or(p.cfg.Limits.MaxBytes, -1),
			Discard:     jetstream.DiscardOld,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = p.js.Stream(ctx, StreamName)
		}
		if err == nil {
			p.log.Info("created jetstream stream", "stream", StreamName, "subjects", AllEvents)
		}
	}
	if err != nil {
		return fmt.Errorf("events: stream %s: %w", StreamName, err)
	}
	p.mu.Lock()
	p.streamAt, p.stream = gen, st
	p.mu.Unlock()
	return nil
}

// StreamLimits bound the DSH_EVENTS stream so it fits its volume: the oldest
// messages are discarded past MaxAge or MaxBytes (the session logs in the
// agent's store stay the truth; a consumer that finds a gap reads the
// session from the agent). Zero is no limit.
type StreamLimits struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// reconcileStream brings an existing stream to what this publisher needs,
// in one update built from one config (two updates from the same cached
// config would undo each other):
//   - a stream created before subjects carried the tenant (filter
//     dsh.events.*) is widened to capture dsh.events.> as well; events
//     already published stay on their old dsh.events.<id> subjects (the
//     durable cursor is not rewound), so tenant-scoped consumers see only
//     what is published after the upgrade;
//   - the configured limits are applied where they differ (the configured
//     ones win; unset ones are left as they are).
func (p *Publisher) reconcileStream(ctx context.Context, st jetstream.Stream) error {
	cfg := st.CachedInfo().Config
	want := cfg
	widen := !slices.Contains(cfg.Subjects, AllEvents)
	if widen {
		want.Subjects = []string{AllEvents}
	}
	if p.cfg.Limits.MaxAge > 0 {
		want.MaxAge = p.cfg.Limits.MaxAge
	}
	if p.cfg.Limits.MaxBytes > 0 {
		want.MaxBytes, want.Discard = p.cfg.Limits.MaxBytes, jetstream.DiscardOld
	}
	limit := want.MaxAge != cfg.MaxAge || want.MaxBytes != cfg.MaxBytes || want.Discard != cfg.Discard
	if !widen && !limit {
		return nil
	}
	if _, err := p.js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("update %s (subjects %v, max age %v, max bytes %d): %w", StreamName, want.Subjects, want.MaxAge, want.MaxBytes, err)
	}
	if widen {
		p.log.Info("widened the jetstream stream's subjects", "stream", StreamName, "subjects", AllEvents)
	}
	if limit {
		p.log.Info("set the jetstream stream's limits", "stream", StreamName, "max_age", want.MaxAge, "max_bytes", want.MaxBytes, "discard", "old")
	}
	return nil
}

// publishSession puts everything queued for one session into the window,
// waiting for acknowledgements whenever it is full; the session's statuses
// go out once all of its events are acknowledged (settle). An error is the
// window's failure: every slot was failed and the round must end.
func (p *Publisher) publishSession(ctx context.Context, s *sessionState) error {
	w := p.win
	p.mu.Lock()
	from := s.cursor
	p.mu.Unlock()
	s.open = true
	for s.failErr == nil {
		if w.full() {
			if err := p.await(ctx, len(w.slots)-1); err != nil {
				p.close(s)
				return err
			}
			continue
		}
		limit := len(w.slots) - w.n
		if s.probe {
			limit = 1
		}
		batch, statuses, done, err := p.nextBatch(ctx, s, from, limit)
		if err != nil {
			s.failErr = err
			break
		}
		if done {
			s.ready = statuses
			break
		}
		for _, q := range batch {
			if err := p.publishEvent(ctx, s, q); err != nil {
				s.failErr = err // nil until now: the loop ran only while it was
				p.abort(ctx, err)
				p.close(s)
				return err
			}
		}
		from = batch[len(batch)-1].ev.GetSeq() + 1
		if s.probe {
			// JetStream refused this session's last attempt: its next
			// event goes alone, and no later one joins it in the window
			// before it is acknowledged, so a stream that starts taking
			// events again between two of them (a limit raised, space
			// freed) cannot store a later event and leave this one out.
			if err := p.await(ctx, 0); err != nil {
				p.close(s)
				return err
			}
		}
	}
	p.close(s)
	return nil
}

// publishEvent publishes one event into the next slot of the window.
func (p *Publisher) publishEvent(ctx context.Context, s *sessionState, q queued) error {
	w := p.win
	data := q.pb
	if data == nil {
		var err error
		if data, err = storeMarshal.Marshal(q.ev); err != nil {
			return fmt.Errorf("events: encode %s seq %d: %w", s.id, q.ev.GetSeq(), err)
		}
	}
	i := w.push(s, q.ev.GetSeq(), q.at)
	msg := w.msg.build(s.subject, w.replies[i], s.tenantTok, s.id, q.ev, data)
	if ref, over := fitPayload(msg, p.nc.MaxPayload()); over {
		// Publishing it whole would fail on every attempt and stall
		// the session's fan-out for good: publish a reference.
		p.log.Warn("event over the NATS max_payload; published a reference instead",
			"session", s.id, "seq", q.ev.GetSeq(), "bytes", len(msg.Data), "max_payload", p.nc.MaxPayload())
		p.cfg.Metrics.RecordOversizeEvent(ctx)
		msg = ref
	}
	err := p.nc.PublishMsg(msg)
	w.msg.msg.Data = nil // copied into the connection's buffer: do not keep the event's bytes
	if err != nil {
		w.unpush()
		return fmt.Errorf("events: publish %s seq %d: %w", s.id, q.ev.GetSeq(), err)
	}
	s.inflight++
	return nil
}

var errAckTimeout = errors.New("events: no JetStream acknowledgement within the ack timeout")

var errDisconnected = errors.New("events: nats disconnected with acknowledgements outstanding")

// await takes replies until at most keep publishes wait for theirs. When
// none comes for AckTimeout, the connection is lost or ctx ends, every
// waiting publish fails (abort) and the error is returned.
func (p *Publisher) await(ctx context.Context, keep int) error {
	w := p.win
	for {
		p.settle(ctx, false, nil)
		if w.n <= keep {
			return nil
		}
		var err error
		w.timer.Reset(p.cfg.AckTimeout)
		select {
		case m := <-w.acks:
			w.reply(m)
			for len(w.acks) > 0 {
				w.reply(<-w.acks)
			}
		case <-w.timer.C:
			err = errAckTimeout
		case <-p.lost:
			err = errDisconnected
		case <-ctx.Done():
			err = ctx.Err()
		}
		w.timer.Stop()
		if err != nil {
			p.abort(ctx, err)
			return err
		}
	}
}

// abort fails every publish still waiting for its reply with err and drops
// the reply subscription (a late reply must not count for a later publish).
func (p *Publisher) abort(ctx context.Context, err error) {
	p.settle(ctx, true, err)
	p.win.abandon()
}

// settle takes the window's oldest slots whose replies came (all of them
// with all, the waiting ones failed with err), in publish order: an
// acknowledgement moves its session's cursor past the event unless an
// earlier event of the session failed, so a cursor only ever passes a
// prefix JetStream acknowledged. A session whose last slot is settled and
// whose events are all in the window is finished (finish).
func (p *Publisher) settle(ctx context.Context, all bool, err error) {
	w := p.win
	if w.n == 0 || (!all && w.slots[w.head].state == slotWaiting) {
		return
	}
	var statuses []statusMsg
	lags := w.lags[:0]
	p.mu.Lock()
	for {
		sl, ok := w.pop(all, err)
		if !ok {
			break
		}
		s := sl.s
		s.inflight--
		switch {
		case s.failErr != nil:
		case sl.state == slotAcked:
			s.cursor = max(s.cursor, sl.seq+1)
			s.probe = false
			lags = append(lags, sl.at)
		default:
			s.failErr = fmt.Errorf("events: publish %s from seq %d: %w", s.id, sl.seq, sl.err)
			if sl.state == slotFailed {
				s.refused, s.probe = sl.seq, true
			}
		}
		if s.inflight == 0 && !s.open {
			statuses = p.finish(s, statuses)
		}
	}
	p.mu.Unlock()
	w.lags = lags
	p.sendStatuses(ctx, statuses, lags)
}

// close ends a session's turn in the window: it is finished now if none of
// its events waits for a reply, else when the last reply is settled.
func (p *Publisher) close(s *sessionState) {
	s.open = false
	if s.inflight > 0 {
		return
	}
	p.mu.Lock()
	statuses := p.finish(s, nil)
	p.mu.Unlock()
	p.sendStatuses(context.Background(), statuses, nil)
}

// statusMsg is a status ready to go out.
type statusMsg struct {
	tenant, id string
	st         agentv1.AgentStatus
}

// finish ends a session's part in the round (p.mu held): after a failure
// it is dirty again, resynced before its next publication and its statuses
// wait with it; otherwise its statuses are appended to out, to go out now
// that every event queued before them is in the stream.
func (p *Publisher) finish(s *sessionState, out []statusMsg) []statusMsg {
	p.trim(s)
	if err := s.failErr; err != nil {
		s.failErr = nil
		p.roundErr = cmp.Or(p.roundErr, err)
		s.resync = true
		p.dirty[s.id] = struct{}{}
		s.statuses = append(s.ready, s.statuses...)
		if n := len(s.statuses); n > maxStatusQueue {
			s.statuses = s.statuses[n-maxStatusQueue:]
		}
		s.ready = nil
		return out
	}
	for _, st := range s.ready {
		out = append(out, statusMsg{s.tenant, s.id, st})
	}
	s.ready = nil
	return out
}

// sendStatuses records the publish lag of the events acknowledged at lags'
// times and publishes the statuses (at most once: a failure drops them).
func (p *Publisher) sendStatuses(ctx context.Context, statuses []statusMsg, lags []time.Time) {
	if len(lags) > 0 {
		now := p.cfg.Now()
		for _, at := range lags {
			p.cfg.Metrics.RecordPublishLag(ctx, now.Sub(at))
		}
	}
	for _, m := range statuses {
		if err := p.nc.PublishMsg(EncodeStatus(m.tenant, m.id, m.st)); err != nil {
			p.log.Debug("status dropped", "session", m.id, "status", m.st, "err", err)
		}
	}
}

// streamTail returns one past the seq of the last event stored on the
// session's subject (0 when none).
func (p *Publisher) streamTail(ctx context.Context, tenant, id string) (int64, error) {
	p.mu.Lock()
	st := p.stream
	p.mu.Unlock()
	if st == nil {
		var err error
		if st, err = p.js.Stream(ctx, StreamName); err != nil {
			return 0, fmt.Errorf("events: stream %s: %w", StreamName, err)
		}
	}
	msg, err := st.GetLastMsgForSubject(ctx, EventSubject(tenant, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("events: last message of %s: %w", id, err)
	}
	seq, err := strconv.ParseInt(msg.Header.Get(HeaderSeq), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("events: last message of %s has a bad %s header: %w", id, HeaderSeq, err)
	}
	return seq + 1, nil
}

// nextBatch returns up to limit contiguous events of s starting exactly at
// from (at or past the cursor: the events between are in the window). When
// the queue holds no event at from (a gap left by an overflow or a
// restart), it reads the missing events from the store if it can;
// otherwise the events wait to be handed in again. With nothing to publish
// from from, it returns done and the statuses queued so far: every event
// queued before them is in the window.
func (p *Publisher) nextBatch(ctx context.Context, s *sessionState, from int64, limit int) (batch []queued, statuses []agentv1.AgentStatus, done bool, err error) {
	p.mu.Lock()
	p.trim(s)
	i, found := slices.BinarySearchFunc(s.pending, from, func(q queued, seq int64) int { return cmp.Compare(q.ev.GetSeq(), seq) })
	if found {
		n := 1
		for i+n < len(s.pending) && n < limit && s.pending[i+n].ev.GetSeq() == from+int64(n) {
			n++
		}
		// A copy: Durable may insert into the queue once p.mu is released.
		p.taken = append(p.taken[:0], s.pending[i:i+n]...)
		p.mu.Unlock()
		return p.taken, nil, false, nil
	}
	gapTo := s.next // exclusive end of the missing range
	if i < len(s.pending) {
		gapTo = s.pending[i].ev.GetSeq()
	}
	sweep, sweeps := s.sweep, s.sweeps
	if (gapTo <= from && !sweep) || p.reader == nil {
		// The statuses are taken under the lock that saw the queue: a
		// status queued later may follow an event queued after this look.
		statuses, s.statuses = s.statuses, nil
		p.mu.Unlock()
		if gapTo > from {
			p.log.Debug("events missing from the queue; waiting for them to be handed in again", "session", s.id, "from", from, "to", gapTo)
		}
		return nil, statuses, true, nil // nothing to publish now
	}
	p.mu.Unlock()
	evs, err := p.reader.ReadEvents(ctx, s.id, from)
	if err != nil {
		return nil, nil, false, fmt.Errorf("events: read %s from %d: %w", s.id, from, err)
	}
	// Everything contiguous the read found is queued (up to QueueLimit), so
	// the next batches come from the queue instead of reading the rest of
	// the log again for each.
	now := p.cfg.Now()
	var out []queued
	for _, ev := range evs {
		want := from + int64(len(out))
		if ev.GetSeq() < want {
			continue
		}
		if ev.GetSeq() != want || (!sweep && ev.GetSeq() >= gapTo) || len(out) >= p.cfg.QueueLimit {
			break
		}
		out = append(out, queued{ev: ev, at: now})
	}
	p.mu.Lock()
	if len(out) == 0 {
		// A CatchUp during the read (a replica's load stored the repair
		// of an interrupted turn after the read's snapshot, then asked for
		// it) keeps the sweep, and the statuses wait behind what it finds:
		// the session is dirty again and read in the next round. Ending
		// the sweep would leave those events in the store alone.
		// Likewise an event at from stored (and handed in) since the read
		// is not in the stream yet, and the statuses queued with it must
		// follow it: Durable marked the session dirty, so they go out in
		// the next round, after it.
		if s.sweeps == sweeps {
			s.sweep = false
			if s.next <= from {
				statuses, s.statuses = s.statuses, nil
			}
		}
		p.mu.Unlock()
		return nil, statuses, true, nil
	}
	s.next = max(s.next, out[len(out)-1].ev.GetSeq()+1)
	p.queueRead(s, out)
	p.mu.Unlock()
	return out[:min(len(out), limit)], nil, false, nil
}

// queueRead merges events read from the store (sorted, contiguous) into
// s's queue, keeping an event already queued (it may hold its encoding),
// and keeps the lowest QueueLimit seqs (p.mu held): the ones dropped are
// read again when their turn comes.
func (p *Publisher) queueRead(s *sessionState, read []queued) {
	merged := make([]queued, 0, min(len(s.pending)+len(read), p.cfg.QueueLimit))
	i, j := 0, 0
	for (i < len(s.pending) || j < len(read)) && len(merged) < p.cfg.QueueLimit {
		switch {
		case j == len(read) || (i < len(s.pending) && s.pending[i].ev.GetSeq() < read[j].ev.GetSeq()):
			merged = append(merged, s.pending[i])
			i++
		case i == len(s.pending) || read[j].ev.GetSeq() < s.pending[i].ev.GetSeq():
			merged = append(merged, read[j])
			j++
		default: // the same seq: keep the queued one
			merged = append(merged, s.pending[i])
			i, j = i+1, j+1
		}
	}
	p.release(s.pending[i:]) // the newest, past the limit
	clear(s.pending)
	s.pending = merged
}

// trim drops the events below the cursor from the queue (p.mu held).
func (p *Publisher) trim(s *sessionState) {
	i := 0
	for i < len(s.pending) && s.pending[i].ev.GetSeq() < s.cursor {
		i++
	}
	p.release(s.pending[:i])
	clear(s.pending[:i]) // the published events and their bytes are garbage now
	s.pending = s.pending[i:]
	if len(s.pending) == 0 {
		s.pending = nil
	}
}

// saveCursors writes every cursor that moved since it was last written:
// in one call when the store writes cursors in batches (CursorBatch), else
// one call per session.
func (p *Publisher) saveCursors(ctx context.Context) {
	p.mu.Lock()
	var (
		moved []*sessionState
		ids   []string
		next  []int64
	)
	for _, s := range p.sessions {
		if s.cursor > max(s.saved, 0) {
			moved = append(moved, s)
			if p.batch != nil {
				ids, next = append(ids, s.id), append(next, s.cursor)
			}
		}
	}
	p.mu.Unlock()
	if len(moved) == 0 {
		return
	}
	if p.batch == nil {
		for _, s := range moved {
			p.saveCursor(ctx, s)
		}
		return
	}
	errs := p.batch.SetPublishedCursors(ctx, ids, next)
	if len(errs) != len(ids) {
		p.log.Warn("saving published cursors: the store answered for the wrong number of sessions", "sessions", len(ids), "answers", len(errs))
		return
	}
	var (
		failed   int
		firstErr error
	)
	p.mu.Lock()
	for i, s := range moved {
		if errs[i] != nil {
			failed++
			firstErr = cmp.Or(firstErr, errs[i])
			continue
		}
		s.saved = max(s.saved, next[i])
	}
	p.mu.Unlock()
	if failed > 0 {
		// Not fatal: the stream's tail moves a cursor on the next start.
		p.log.Warn("saving published cursors failed", "sessions", failed, "of", len(moved), "err", firstErr)
	}
}

func (p *Publisher) saveCursor(ctx context.Context, s *sessionState) {
	p.mu.Lock()
	cursor, saved := s.cursor, s.saved
	p.mu.Unlock()
	if cursor <= max(saved, 0) {
		return // nothing new, or a session with no published event yet
	}
	if err := p.cfg.Store.SetPublishedCursor(ctx, s.id, cursor); err != nil {
		// Not fatal: the stream's tail moves the cursor on the next start.
		p.log.Warn("saving the published cursor failed", "session", s.id, "cursor", cursor, "err", err)
		return
	}
	p.mu.Lock()
	s.saved = cursor
	p.mu.Unlock()
}
