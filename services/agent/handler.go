package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"unicode"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/fileopen"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// CreateSession creates a session.
func (s *Service) CreateSession(ctx context.Context, req *agentv1.CreateSessionRequest) (*agentv1.CreateSessionResponse, error) {
	sess, err := s.createSession(ctx, req)
	if err != nil {
		return nil, toStatus(s.log, "CreateSession", err)
	}
	return &agentv1.CreateSessionResponse{Session: sess}, nil
}

// createSession is CreateSession once: a request_id names the session it
// made (header.request_id; the id is derived from it when none is given), so
// a retry finds that session and answers with it.
func (s *Service) createSession(ctx context.Context, req *agentv1.CreateSessionRequest) (*agentv1.Session, error) {
	rid := req.GetRequestId()
	if err := checkRequestID(rid); err != nil {
		return nil, err
	}
	if rid == "" {
		return s.createNew(ctx, req, "")
	}
	key := s.replyKey(ctx, "CreateSession", "", rid)
	id := req.GetSessionId()
	if v, ok := s.replies.Get(key); ok {
		id = v.(*agentv1.Session).GetHeader().GetId()
	} else if id == "" {
		id = derivedID(key.Tenant, rid)
	}
	sess, err := s.createNew(ctx, req, id)
	if errors.Is(err, persistence.ErrExists) {
		prior, ok, perr := s.createdBy(ctx, id, rid)
		if perr != nil {
			return nil, perr
		}
		if ok {
			return prior, nil
		}
	}
	if err == nil {
		s.replies.Put(key, sess)
	}
	return sess, err
}

func (s *Service) createNew(ctx context.Context, req *agentv1.CreateSessionRequest, id string) (*agentv1.Session, error) {
	opts := req.GetOptions()
	if opts.GetProvider() == "" || opts.GetModel() == "" {
		return nil, invalidf("options.provider and options.model are required")
	}
	if opts.MaxTokens != nil && opts.GetMaxTokens() <= 0 {
		return nil, invalidf("options.max_tokens must be positive, got %d", opts.GetMaxTokens())
	}
	if t := opts.GetTemperature(); opts.Temperature != nil && (math.IsNaN(t) || t < 0 || t > 2) {
		return nil, invalidf("options.temperature must be between 0 and 2, got %v", t)
	}
	if err := checkCreateOptions(opts); err != nil {
		return nil, err
	}
	// The gateway's providers and the toolhosts' view of the cwd are asked
	// side by side (two round trips on the way to a new session's first
	// request); a provider error is still the one reported first.
	provider := make(chan error, 1)
	go func() { provider <- s.checkProvider(ctx, opts.GetProvider()) }()
	cwd, err := s.checkNewCwd(ctx, req.GetCwd(), opts)
	if perr := <-provider; perr != nil {
		return nil, perr
	}
	if err != nil {
		return nil, err
	}
	if id == "" {
		id = req.GetSessionId()
	}
	if id == "" { // mint one only when needed (NewID may be a sequence)
		id = s.cfg.NewID()
	}
	if err := checkID(id); err != nil {
		return nil, err
	}
	h := &sessionv1.SessionHeader{Id: id, CreatedAt: s.cfg.Now().UnixMilli(), Cwd: cwd, Options: proto.CloneOf(opts),
		Tenant: principalOf(ctx).Tenant, RequestId: req.GetRequestId()}
	return s.start(ctx, h, nil)
}

// checkNewCwd is a new session's cwd (the default unless given), checked
// here and by its toolhosts.
func (s *Service) checkNewCwd(ctx context.Context, cwd string, opts *sessionv1.SessionOptions) (string, error) {
	defaulted := ""
	if cwd == "" {
		cwd, defaulted = s.cfg.DefaultCwd, " (the agent's default cwd, as the request sent none)"
	}
	if cwd != "" && !filepath.IsAbs(cwd) {
		return "", invalidf("cwd %q must be an absolute path", cwd)
	}
	if r := opts.GetWorkspaceRoot(); r != "" && !filepath.IsAbs(r) {
		return "", invalidf("options.workspace_root %q must be an absolute path", r)
	} else if r != "" && slices.Contains(strings.Split(r, "/"), "..") {
		return "", invalidf("options.workspace_root %q must not contain \"..\" (name the directory itself)", r)
	} else if r != "" && cwd != "" && !fileopen.Within(cwd, r) {
		// Its toolhosts refuse every call of such a session, and its
		// workspace context would be another tree's. The check is
		// lexical: a link in the cwd is resolved by the toolhosts, which
		// refuse every call whose cwd resolves outside its root.
		return "", invalidf("cwd %q%s is outside options.workspace_root %q: send a cwd inside the session's workspace root", cwd, defaulted, r)
	}
	if err := s.checkCwd(ctx, cwd, opts); err != nil {
		return "", err
	}
	return cwd, nil
}

// start registers a new session (header + optional seed) and brings it live.
// It reserves the id as a load does (reserve): a second create or a load of
// the same id waits for this one to end, so a create retried while the
// first still runs finds the session live and is answered with it
// (createdBy), not ALREADY_EXISTS for a session the retry's request made.
func (s *Service) start(ctx context.Context, h *sessionv1.SessionHeader, seed []*sessionv1.SessionEvent) (*agentv1.Session, error) {
	id := h.GetId()
	live, unmark, err := s.reserve(ctx, id, nil)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("create session %s: waiting for another create or load of it: %w", id, err)
	case err != nil:
		return nil, err
	case live != nil:
		return nil, fmt.Errorf("create session %s: %w", id, existsErr(id))
	}
	defer unmark()
	log, err := session.NewLog(h, seed, s.logOptions()...)
	if err != nil {
		return nil, invalidf("session seed is invalid: %v", err)
	}
	if err := s.deps.Store.Create(ctx, h); err != nil {
		return nil, fmt.Errorf("create session %s: %w", id, err)
	}
	if cs, ok := s.cfg.Sink.(createdSink); ok {
		cs.Created(h.GetTenant(), id)
	}
	l := s.open(ctx, log, 0, "startup")
	if len(seed) > 0 {
		if err := l.flush(ctx); err != nil {
			_, _ = l.agent.Dispose(ctx)
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing { // the id is reserved: only Close can have intervened
		_, _ = l.agent.Dispose(ctx)
		return nil, ErrClosing
	}
	l.lastUsed = s.cfg.Now()
	s.live[id] = l
	return l.snapshot(), nil
}

func checkID(id string) error {
	if len(id) > 256 {
		return invalidf("session id is %d bytes long; the limit is 256", len(id))
	}
	for _, r := range id {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return invalidf("session id %q contains a control or invalid character", id)
		}
	}
	return nil
}

// GetSession reads a session (loading it when persisted).
func (s *Service) GetSession(ctx context.Context, req *agentv1.GetSessionRequest) (*agentv1.GetSessionResponse, error) {
	if sn, ok, err := s.peekStored(ctx, req.GetSessionId()); ok { // not in memory: not loaded for this
		if err != nil {
			return nil, toStatus(s.log, "GetSession", err)
		}
		return &agentv1.GetSessionResponse{Session: sn}, nil
	}
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, "GetSession", err)
	}
	defer s.release(l)
	out := l.snapshot()
	out.Context = s.contextOf(ctx, l)
	return &agentv1.GetSessionResponse{Session: out}, nil
}

// ListSessions pages through stored and live sessions by id. Sessions not in
// memory are reported UNLOADED with next_seq 0 (listing never loads logs).
func (s *Service) ListSessions(ctx context.Context, req *agentv1.ListSessionsRequest) (*agentv1.ListSessionsResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, toStatus(s.log, "ListSessions", invalidf("page_size must not be negative"))
	case size == 0:
		size = 50
	case size > 1000:
		size = 1000
	}
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) == 0 {
			return nil, toStatus(s.log, "ListSessions", invalidf("page_token %q is not a token this service issued", tok))
		}
		after = string(b)
	}
	tenant, err := listTenant(principalOf(ctx), req.GetTenant())
	if err != nil {
		return nil, toStatus(s.log, "ListSessions", err)
	}
	hs, live, err := s.headers(ctx)
	if err != nil {
		return nil, toStatus(s.log, "ListSessions", err)
	}
	resp := &agentv1.ListSessionsResponse{}
	for _, h := range hs {
		if tenant != anyTenant && auth.TenantOf(h.GetTenant()) != tenant {
			continue
		}
		if p := req.GetParentSession(); p != "" && h.GetParentSession() != p {
			continue
		}
		if after != "" && h.GetId() <= after {
			continue
		}
		if len(resp.Sessions) == size {
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(resp.Sessions[size-1].GetHeader().GetId()))
			break
		}
		if l, ok := live[h.GetId()]; ok {
			resp.Sessions = append(resp.Sessions, l.snapshot())
		} else {
			resp.Sessions = append(resp.Sessions, &agentv1.Session{Header: h, Status: agentv1.AgentStatus_AGENT_STATUS_UNLOADED})
		}
	}
	return resp, nil
}

// anyTenant, as ListSessionsRequest.tenant, lets an admin list every tenant.
const anyTenant = "*"

// listTenant is the tenant a ListSessions call lists: the caller's own by
// default; another (or anyTenant) only for an admin.
func listTenant(p auth.Principal, asked string) (string, error) {
	switch {
	case asked == "" || asked == p.Tenant:
		return p.Tenant, nil
	case p.Admin():
		return asked, nil
	}
	return "", status.Errorf(codes.PermissionDenied, "only an admin may list another tenant (%q) than its own (%q)", asked, p.Tenant)
}

// ForkSession copies a session through a turn/end into a new session.
func (s *Service) ForkSession(ctx context.Context, req *agentv1.ForkSessionRequest) (*agentv1.ForkSessionResponse, error) {
	sess, err := s.fork(ctx, req)
	if err != nil {
		return nil, toStatus(s.log, "ForkSession", err)
	}
	return &agentv1.ForkSessionResponse{Session: sess}, nil
}

func (s *Service) fork(ctx context.Context, req *agentv1.ForkSessionRequest) (*agentv1.Session, error) {
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	defer s.release(l)
	events := l.log.Events()
	if len(events) == 0 {
		return nil, invalidf("session %s has no events; there is no turn/end to fork at", l.id)
	}
	b := int64(len(events) - 1)
	if req.BoundarySeq != nil {
		b = req.GetBoundarySeq()
	}
	if b < 0 || b >= int64(len(events)) {
		return nil, invalidf("boundary_seq %d is outside the log (0..%d)", b, len(events)-1)
	}
	if events[b].GetTurnEnd() == nil {
		return nil, invalidf("boundary_seq %d is a %s event, not a turn/end: fork at a turn/end", b, session.TypeName(events[b]))
	}
	id := req.GetNewSessionId()
	if id == "" {
		id = s.cfg.NewID()
	}
	if err := checkID(id); err != nil {
		return nil, err
	}
	src := l.log.Header()
	seed := make([]*sessionv1.SessionEvent, b+1)
	for i := range seed {
		seed[i] = proto.CloneOf(events[i])
	}
	n := b + 1
	h := &sessionv1.SessionHeader{Id: id, CreatedAt: s.cfg.Now().UnixMilli(), Cwd: src.GetCwd(),
		ParentSession: src.GetId(), SeedLength: &n, DelegationDepth: src.GetDelegationDepth(), Options: proto.CloneOf(src.GetOptions()),
		Tenant: auth.TenantOf(src.GetTenant())}
	return s.start(ctx, h, seed)
}

// Send queues a prompt.
func (s *Service) Send(ctx context.Context, req *agentv1.SendRequest) (*agentv1.SendResponse, error) {
	resp, err := once(s, ctx, "Send", req.GetSessionId(), req.GetRequestId(), func() (*agentv1.SendResponse, error) {
		st, err := s.submit(ctx, req.GetSessionId(), req.GetRequestId(), req.GetContent(), req.GetSource(), req.GetContexts(), false)
		return &agentv1.SendResponse{Status: st}, err
	})
	if err != nil {
		return nil, toStatus(s.log, "Send", err)
	}
	return resp, nil
}

// Steer submits steering.
func (s *Service) Steer(ctx context.Context, req *agentv1.SteerRequest) (*agentv1.SteerResponse, error) {
	resp, err := once(s, ctx, "Steer", req.GetSessionId(), req.GetRequestId(), func() (*agentv1.SteerResponse, error) {
		st, err := s.submit(ctx, req.GetSessionId(), req.GetRequestId(), req.GetContent(), req.GetSource(), req.GetContexts(), true)
		return &agentv1.SteerResponse{Status: st}, err
	})
	if err != nil {
		return nil, toStatus(s.log, "Steer", err)
	}
	return resp, nil
}

// admitting is ErrClosing while the service drains: running turns finish,
// no new one starts — a message's turn or a compaction's (a live session's
// fast path in acquire does not look at closing, and reads must go on).
func (s *Service) admitting() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return ErrClosing
	}
	return nil
}

func (s *Service) submit(ctx context.Context, id, rid string, content []*llmv1.ContentBlock, src *llmv1.MessageSource, contexts []*toolsv1.HookContext, steer bool) (agentv1.AgentStatus, error) {
	if err := s.admitting(); err != nil {
		return 0, err
	}
	if err := checkContent("content", content); err != nil {
		return 0, err
	}
	if err := checkSource("source", src); err != nil {
		return 0, err
	}
	for i, c := range contexts {
		if err := checkContext(fmt.Sprintf("contexts[%d]", i), c); err != nil {
			return 0, err
		}
	}
	l, err := s.acquire(ctx, id)
	if err != nil {
		return 0, err
	}
	defer s.release(l)
	it := loop.Item{Content: session.CloneAll(content), Source: proto.CloneOf(src), Contexts: session.CloneAll(contexts),
		QueuedBy: trace.SpanContextFromContext(ctx), RequestID: rid}
	if steer {
		return l.agent.Steer(it)
	}
	return l.agent.Send(it)
}

// Inject appends context.
func (s *Service) Inject(ctx context.Context, req *agentv1.InjectRequest) (*agentv1.InjectResponse, error) {
	_, err := once(s, ctx, "Inject", req.GetSessionId(), req.GetRequestId(), func() (*agentv1.InjectResponse, error) {
		return &agentv1.InjectResponse{}, s.inject(ctx, req)
	})
	if err != nil {
		return nil, toStatus(s.log, "Inject", err)
	}
	return &agentv1.InjectResponse{}, nil
}

func (s *Service) inject(ctx context.Context, req *agentv1.InjectRequest) error {
	if err := checkContent("content", req.GetContent()); err != nil {
		return err
	}
	if err := checkSource("source", req.GetSource()); err != nil {
		return err
	}
	if err := checkJSON("meta", req.Meta); err != nil {
		return err
	}
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return err
	}
	defer s.release(l)
	return l.agent.InjectOnce(req.GetRequestId(), session.CloneAll(req.GetContent()), proto.CloneOf(req.GetSource()), req.Meta)
}

// Cancel cancels.
func (s *Service) Cancel(ctx context.Context, req *agentv1.CancelRequest) (*agentv1.CancelResponse, error) {
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, "Cancel", err)
	}
	defer s.release(l)
	cause := loop.ErrCancelUser
	if req.GetCause() == agentv1.CancelCause_CANCEL_CAUSE_PARENT {
		cause = loop.ErrCancelParent
	}
	return &agentv1.CancelResponse{Effective: l.agent.Cancel(cause)}, nil
}

// WaitIdle blocks until quiescence or the RPC deadline.
func (s *Service) WaitIdle(ctx context.Context, req *agentv1.WaitIdleRequest) (*agentv1.WaitIdleResponse, error) {
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, "WaitIdle", err)
	}
	defer s.release(l)
	if err := l.agent.WaitIdle(ctx); err != nil {
		return nil, toStatus(s.log, "WaitIdle", err)
	}
	return &agentv1.WaitIdleResponse{Session: l.snapshot()}, nil
}

// GetMessages returns the derived history.
func (s *Service) GetMessages(ctx context.Context, req *agentv1.GetMessagesRequest) (*agentv1.GetMessagesResponse, error) {
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, "GetMessages", err)
	}
	defer s.release(l)
	return &agentv1.GetMessagesResponse{Messages: l.log.Messages()}, nil
}

// StreamEvents replays the log from from_seq, then follows live events. A
// subscriber reads from the in-memory log at its own pace: a slow client
// never slows the loop and never misses an event. With include_progress it
// also gets running calls' live output (ToolProgress), which is not in the
// log: each message follows the events up to its after_seq and precedes
// the later ones (so a call's progress comes before its tool/result); a
// client too slow for it loses progress messages (counted, logged), never
// events.
func (s *Service) StreamEvents(req *agentv1.StreamEventsRequest, stream grpc.ServerStreamingServer[agentv1.StreamEventsResponse]) error {
	ctx := stream.Context()
	if req.GetFromSeq() < 0 {
		return toStatus(s.log, "StreamEvents", invalidf("from_seq must not be negative"))
	}
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return toStatus(s.log, "StreamEvents", err)
	}
	defer s.release(l)
	wake, unsubscribe := l.subscribe()
	defer unsubscribe()
	var progC <-chan *agentv1.ToolProgress
	if req.GetIncludeProgress() && !req.GetNoFollow() {
		s.progressSubs.Add(1)
		sub := l.progress.Subscribe(0)
		defer func() {
			sub.Close()
			s.progressSubs.Add(-1)
			if n := sub.Dropped(); n > 0 {
				s.log.Info("a slow StreamEvents subscriber lost live tool progress", "session", l.id, "dropped", n)
			}
		}()
		progC = sub.C()
	}
	next := req.GetFromSeq()
	var pending []*agentv1.ToolProgress
	sendEvents := func(evs []*sessionv1.SessionEvent) error {
		for _, ev := range evs {
			if err := stream.Send(&agentv1.StreamEventsResponse{Event: ev}); err != nil {
				return err
			}
			next = ev.GetSeq() + 1
		}
		return nil
	}
	for {
		// Events first, then the progress published so far: a progress
		// message published after this read has an after_seq this read
		// may not cover, so it waits for the next round.
		evs := l.log.EventsFrom(next)
		pending = drainProgress(progC, pending)
		for len(pending) > 0 {
			p := pending[0]
			cut := 0
			for cut < len(evs) && evs[cut].GetSeq() <= p.GetAfterSeq() {
				cut++
			}
			if err := sendEvents(evs[:cut]); err != nil {
				return err
			}
			evs = evs[cut:]
			if p.GetAfterSeq() >= next {
				break // its events are not read yet
			}
			if err := stream.Send(&agentv1.StreamEventsResponse{Progress: p}); err != nil {
				return err
			}
			pending = pending[1:]
		}
		if err := sendEvents(evs); err != nil {
			return err
		}
		if req.GetNoFollow() {
			return nil
		}
		select {
		case <-wake:
		case p := <-progC:
			pending = append(pending, p)
		case <-ctx.Done():
			return nil
		case <-s.closed:
			return sendEvents(l.log.EventsFrom(next))
		case <-l.dropped:
			// The lease is lost: what this replica appends now is never
			// stored, and the new owner's events never reach this log.
			return status.Errorf(codes.Unavailable, "session %s left this replica (another replica owns it now): call again", l.id)
		}
	}
}

// drainProgress appends what c holds now, without waiting.
func drainProgress(c <-chan *agentv1.ToolProgress, into []*agentv1.ToolProgress) []*agentv1.ToolProgress {
	for {
		select {
		case p := <-c:
			into = append(into, p)
		default:
			return into
		}
	}
}

// Validation.

func checkContent(field string, blocks []*llmv1.ContentBlock) error {
	if len(blocks) == 0 {
		return invalidf("%s must have at least one block", field)
	}
	for i, b := range blocks {
		if err := checkBlock(fmt.Sprintf("%s[%d]", field, i), b); err != nil {
			return err
		}
	}
	return nil
}

func checkBlock(field string, b *llmv1.ContentBlock) error {
	switch v := b.GetBlock().(type) {
	case *llmv1.ContentBlock_Text, *llmv1.ContentBlock_Reasoning:
		return nil
	case *llmv1.ContentBlock_Image:
		switch {
		case v.Image.GetUrl() == "" && len(v.Image.GetData()) == 0:
			return invalidf("%s: image needs a url or inline data", field)
		case len(v.Image.GetData()) > 0 && v.Image.GetMimeType() == "":
			return invalidf("%s: inline image data needs a mime_type", field)
		}
		return nil
	case *llmv1.ContentBlock_Extension:
		if v.Extension.GetType() == "" {
			return invalidf("%s: extension block needs a type", field)
		}
		if j := v.Extension.GetJson(); j != "" && !json.Valid([]byte(j)) {
			return invalidf("%s: extension json is not valid JSON", field)
		}
		return nil
	case *llmv1.ContentBlock_ToolCall, *llmv1.ContentBlock_ToolResult:
		return invalidf("%s: tool-call and tool-result blocks are produced by the loop, not sent by clients", field)
	default:
		return invalidf("%s: block has no content variant set", field)
	}
}

func checkSource(field string, src *llmv1.MessageSource) error {
	if src == nil {
		return nil
	}
	switch v := src.GetKind().(type) {
	case nil:
		return invalidf("%s: set a source variant or omit the source", field)
	case *llmv1.MessageSource_Plugin:
		if v.Plugin.GetPlugin() == "" {
			return invalidf("%s: plugin source needs a plugin name", field)
		}
	case *llmv1.MessageSource_Agent:
		if v.Agent.GetSessionId() == "" {
			return invalidf("%s: agent source needs a session_id", field)
		}
	case *llmv1.MessageSource_Extension:
		if j := v.Extension.GetJson(); j != "" && !json.Valid([]byte(j)) {
			return invalidf("%s: extension json is not valid JSON", field)
		}
	}
	return nil
}

func checkContext(field string, c *toolsv1.HookContext) error {
	if err := checkContent(field+".content", c.GetContent()); err != nil {
		return err
	}
	if c.GetSource() == nil {
		return invalidf("%s.source is required (hook contexts must say who produced them)", field)
	}
	if err := checkSource(field+".source", c.GetSource()); err != nil {
		return err
	}
	return checkJSON(field+".meta", c.Meta)
}

func checkJSON(field string, s *string) error {
	if s != nil && !json.Valid([]byte(*s)) {
		return invalidf("%s is not valid JSON", field)
	}
	return nil
}

// cwdChecker is a workspace source that can tell, before a session exists,
// whether its toolhosts accept its cwd within its workspace root
// (prompt.Workspaces).
type cwdChecker interface {
	CheckCwd(ctx context.Context, cwd, root string, hosts []string) error
}

// checkCwd refuses a new session whose cwd a visible toolhost refuses (in a
// cluster: a client's local path, or an agent default outside the
// toolhost's workspace volume), as INVALID_ARGUMENT at creation.
func (s *Service) checkCwd(ctx context.Context, cwd string, opts *sessionv1.SessionOptions) error {
	c, ok := s.deps.Workspace.(cwdChecker)
	if !ok || cwd == "" {
		return nil
	}
	if err := c.CheckCwd(ctx, cwd, opts.GetWorkspaceRoot(), opts.GetToolhosts()); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return invalidf("%v; create the session with a cwd inside that toolhost's workspace (the agent's --default-cwd is the default)", err)
	}
	return nil
}
