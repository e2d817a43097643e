package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
)

// env runs the agent process (agent.Run) against a fake gateway and a fake
// toolhost over loopback gRPC, with SQLite under a temp dir.
type env struct {
	t      *testing.T
	gw     *fakes.Gateway
	host   *fakes.ToolHost
	gwAddr string
	thAddr string
	dir    string
	sink   *recordingSink
	cfg    agent.Config
	nats   events.Conn
	// authn authenticates clients (nil: --auth none).
	authn auth.Authenticator
	// shutdown bounds agent.Run's graceful close; default 10 s.
	shutdown time.Duration
	// approvers and interceptors are remote services given to agent.Run.
	approvers, interceptors []agent.Remote
	// onToolhost is ServerConfig.OnToolhost.
	onToolhost func(name string, up bool, err error)
	// toolhosts are more toolhosts ("name=addr") beside the fake.
	toolhosts []string

	client agentv1.AgentServiceClient
	addr   string // the agent's listening address (changes at restart)
	cancel context.CancelFunc
	done   chan error
}

func newEnv(t *testing.T, tools ...fakes.Tool) *env {
	t.Helper()
	return newEnvWith(t, nil, tools...)
}

func newEnvWith(t *testing.T, mutate func(*agent.Config), tools ...fakes.Tool) *env {
	t.Helper()
	return newEnvFull(t, func(e *env) {
		if mutate != nil {
			mutate(&e.cfg)
		}
	}, tools...)
}

// newEnvAuth is newEnvWith with client authentication authn.
func newEnvAuth(t *testing.T, authn auth.Authenticator, mutate func(*agent.Config), tools ...fakes.Tool) *env {
	t.Helper()
	return newEnvFull(t, func(e *env) {
		e.authn = authn
		if mutate != nil {
			mutate(&e.cfg)
		}
	}, tools...)
}

// newEnvFull is newEnvWith with access to the whole env before the start.
func newEnvFull(t *testing.T, mutate func(*env), tools ...fakes.Tool) *env {
	t.Helper()
	e := &env{t: t, gw: &fakes.Gateway{}, host: fakes.NewToolHost(tools...), dir: t.TempDir(), sink: &recordingSink{}}
	e.gwAddr = fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, e.gw) })
	e.thAddr = fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, e.host) })
	e.cfg = agent.Config{Debug: true, DefaultCwd: "/work", Sink: e.sink}
	mutate(e)
	if e.cfg.Sink == nil {
		e.nats = events.Conn{URL: natstest.Start(t).URL()}
	}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *env) start() {
	e.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	retry := hooks.DefaultRetryPolicy()
	retry.Sleep = func(context.Context, time.Duration) error { return nil }
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan error, 1)
	go func() {
		e.done <- agent.Run(ctx, agent.ServerConfig{
			Listener: lis, Gateway: e.gwAddr, Toolhosts: append([]string{"fake=" + e.thAddr}, e.toolhosts...), DataDir: e.dir,
			Synchronous: "NORMAL", Service: e.cfg, Retry: &retry, ShutdownTimeout: e.shutdownTimeout(), NATS: e.nats, NoTitles: true,
			Auth: e.authn, Approvers: e.approvers, Interceptors: e.interceptors, OnToolhost: e.onToolhost,
		}, slog.New(slog.DiscardHandler))
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	e.client = agentv1.NewAgentServiceClient(conn)
}

func (e *env) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	if err := <-e.done; err != nil {
		e.t.Errorf("agent.Run: %v", err)
	}
	e.cancel = nil
}

func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.start()
}

func (e *env) create(id string) *agentv1.Session {
	e.t.Helper()
	resp, err := e.client.CreateSession(e.t.Context(), &agentv1.CreateSessionRequest{SessionId: id,
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
	if err != nil {
		e.t.Fatalf("create %s: %v", id, err)
	}
	return resp.GetSession()
}

func (e *env) send(id, text string) {
	e.t.Helper()
	if _, err := e.client.Send(e.t.Context(), &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(text)}}); err != nil {
		e.t.Fatalf("send: %v", err)
	}
}

func (e *env) waitIdle(id string) *agentv1.Session {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 20*time.Second)
	defer cancel()
	resp, err := e.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id})
	if err != nil {
		e.t.Fatalf("wait idle: %v", err)
	}
	return resp.GetSession()
}

func (e *env) events(id string) []*sessionv1.SessionEvent {
	e.t.Helper()
	return e.eventsCtx(e.t.Context(), id)
}

// eventsCtx reads a session's log with ctx's credentials.
func (e *env) eventsCtx(ctx context.Context, id string) []*sessionv1.SessionEvent {
	e.t.Helper()
	stream, err := e.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*sessionv1.SessionEvent
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return out
		}
		if err != nil {
			e.t.Fatalf("stream: %v", err)
		}
		out = append(out, resp.GetEvent())
	}
}

type recordingSink struct {
	mu     sync.Mutex
	events map[string][]*sessionv1.SessionEvent
}

func (r *recordingSink) Durable(_, id string, evs []*sessionv1.SessionEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.events == nil {
		r.events = map[string][]*sessionv1.SessionEvent{}
	}
	r.events[id] = append(r.events[id], evs...)
}

func (r *recordingSink) Status(string, string, agentv1.AgentStatus) {}

func (r *recordingSink) of(id string) []*sessionv1.SessionEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[id])
}

func code(err error) codes.Code { return status.Code(err) }

func types(evs []*sessionv1.SessionEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = session.TypeName(ev)
	}
	return out
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.create("s1")
	ctx := t.Context()
	meta := "{not json"
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"unknown provider", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "nope", Model: "m"}})
			return err
		}, codes.InvalidArgument},
		{"missing model", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "fake"}})
			return err
		}, codes.InvalidArgument},
		{"negative max tokens", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", MaxTokens: proto.Int32(-1)}})
			return err
		}, codes.InvalidArgument},
		{"unknown provider and a relative cwd: the provider's error", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: "rel", Options: &sessionv1.SessionOptions{Provider: "nope", Model: "m"}})
			if err != nil && !strings.Contains(status.Convert(err).Message(), "nope") {
				return fmt.Errorf("%v (want the provider's error, checked side by side with the cwd)", err) // not wrapped: the code becomes Unknown
			}
			return err
		}, codes.InvalidArgument},
		{"relative cwd", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: "rel", Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}})
			return err
		}, codes.InvalidArgument},
		{"relative workspace root", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", WorkspaceRoot: "ws/a"}})
			return err
		}, codes.InvalidArgument},
		{"workspace root with ..", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", WorkspaceRoot: "/ws/a/../b"}})
			return err
		}, codes.InvalidArgument},
		{"cwd outside the workspace root", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: "/ws/b", Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", WorkspaceRoot: "/ws/a"}})
			if err != nil && !strings.Contains(status.Convert(err).Message(), `outside options.workspace_root "/ws/a"`) {
				return fmt.Errorf("%v (want the cwd named outside the root)", err)
			}
			return err
		}, codes.InvalidArgument},
		{"cwd sharing the workspace root's name as a prefix", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: "/ws/ab", Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", WorkspaceRoot: "/ws/a"}})
			if err != nil && !strings.Contains(status.Convert(err).Message(), `cwd "/ws/ab" is outside options.workspace_root "/ws/a"`) {
				return fmt.Errorf("%v (want the cwd named outside the root)", err)
			}
			return err
		}, codes.InvalidArgument},
		{"default cwd outside the workspace root", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", WorkspaceRoot: "/work/a"}})
			if err != nil && !strings.Contains(status.Convert(err).Message(), "the agent's default cwd") {
				return fmt.Errorf("%v (want the cwd said to be the default)", err)
			}
			return err
		}, codes.InvalidArgument},
		{"unknown sandbox mode", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m", Sandbox: &toolsv1.SandboxPolicy{Mode: 42}}})
			return err
		}, codes.InvalidArgument},
		{"duplicate id", func() error {
			_, err := e.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "s1", Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m"}})
			return err
		}, codes.AlreadyExists},
		{"unknown session", func() error {
			_, err := e.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "ghost"})
			return err
		}, codes.NotFound},
		{"send to unknown session", func() error {
			_, err := e.client.Send(ctx, &agentv1.SendRequest{SessionId: "ghost", Content: []*llmv1.ContentBlock{session.Text("x")}})
			return err
		}, codes.NotFound},
		{"empty content", func() error {
			_, err := e.client.Send(ctx, &agentv1.SendRequest{SessionId: "s1"})
			return err
		}, codes.InvalidArgument},
		{"block without variant", func() error {
			_, err := e.client.Send(ctx, &agentv1.SendRequest{SessionId: "s1", Content: []*llmv1.ContentBlock{{}}})
			return err
		}, codes.InvalidArgument},
		{"tool call in a prompt", func() error {
			_, err := e.client.Steer(ctx, &agentv1.SteerRequest{SessionId: "s1", Content: []*llmv1.ContentBlock{session.ToolCallBlock("c", "x", "{}")}})
			return err
		}, codes.InvalidArgument},
		{"context without source", func() error {
			_, err := e.client.Send(ctx, &agentv1.SendRequest{SessionId: "s1", Content: []*llmv1.ContentBlock{session.Text("x")},
				Contexts: []*toolsv1.HookContext{{Content: []*llmv1.ContentBlock{session.Text("c")}}}})
			return err
		}, codes.InvalidArgument},
		{"inject meta not JSON", func() error {
			_, err := e.client.Inject(ctx, &agentv1.InjectRequest{SessionId: "s1", Content: []*llmv1.ContentBlock{session.Text("x")}, Meta: &meta})
			return err
		}, codes.InvalidArgument},
		{"negative from_seq", func() error {
			s, err := e.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "s1", FromSeq: -1})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument},
		{"bad page token", func() error {
			_, err := e.client.ListSessions(ctx, &agentv1.ListSessionsRequest{PageToken: "!!"})
			return err
		}, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if code(err) != tc.want {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if err != nil && status.Convert(err).Message() == "" {
				t.Errorf("empty error message")
			}
		})
	}
}

func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakes.Tool{Name: "echo"})
	e.gw.Script(
		fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c1", Name: "echo", Args: `{"a":1}`})},
		fakes.Response{Chunks: fakes.Text("first answer")},
	)
	s := e.create("")
	id := s.GetHeader().GetId()
	if id == "" || s.GetStatus() != agentv1.AgentStatus_AGENT_STATUS_IDLE || s.GetHeader().GetCwd() != "/work" {
		t.Fatalf("created %v", s)
	}

	// Two live subscribers before the turn.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var subs [2]agentv1.AgentService_StreamEventsClient
	for i := range subs {
		st, err := e.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id})
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = st
	}
	e.send(id, "hello")
	got := e.waitIdle(id)
	if got.GetNextSeq() == 0 || got.OpenTurn != nil || got.GetQueued() != 0 {
		t.Errorf("after the turn: %v", got)
	}
	all := e.events(id)
	for i, st := range subs {
		for n := range all {
			resp, err := st.Recv()
			if err != nil {
				t.Fatalf("subscriber %d: %v", i, err)
			}
			if !proto.Equal(resp.GetEvent(), all[n]) {
				t.Fatalf("subscriber %d event %d differs", i, n)
			}
		}
	}
	// Replay from the middle.
	mid, err := e.client.StreamEvents(t.Context(), &agentv1.StreamEventsRequest{SessionId: id, FromSeq: 5, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := mid.Recv(); err != nil || first.GetEvent().GetSeq() != 5 {
		t.Errorf("replay from 5: %v %v", first, err)
	}

	msgs, err := e.client.GetMessages(t.Context(), &agentv1.GetMessagesRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(msgs.GetMessages()); n != 4 {
		t.Errorf("derived %d messages, want 4 (user, assistant call, result, assistant)", n)
	}

	// The sink saw every event once, in order, once durable.
	durable := e.sink.of(id)
	if len(durable) != len(all) {
		t.Errorf("sink got %d events, log has %d", len(durable), len(all))
	}
	for i, ev := range durable {
		if ev.GetSeq() != int64(i) {
			t.Fatalf("sink event %d has seq %d", i, ev.GetSeq())
		}
	}

	// Fork: a non-turn/end boundary is refused, naming the seq.
	_, err = e.client.ForkSession(t.Context(), &agentv1.ForkSessionRequest{SessionId: id, BoundarySeq: proto.Int64(1)})
	if code(err) != codes.InvalidArgument || !contains(status.Convert(err).Message(), "boundary_seq 1") {
		t.Errorf("fork at 1: %v", err)
	}
	fork, err := e.client.ForkSession(t.Context(), &agentv1.ForkSessionRequest{SessionId: id, NewSessionId: "child"})
	if err != nil {
		t.Fatal(err)
	}
	h := fork.GetSession().GetHeader()
	if h.GetParentSession() != id || h.GetSeedLength() != int64(len(all)) || fork.GetSession().GetNextSeq() != int64(len(all)) {
		t.Errorf("fork header %v", h)
	}
	e.send("child", "and then?")
	e.waitIdle("child")

	// List, paged by id.
	e.create("zz")
	page1, err := e.client.ListSessions(t.Context(), &agentv1.ListSessionsRequest{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	page2, err := e.client.ListSessions(t.Context(), &agentv1.ListSessionsRequest{PageSize: 2, PageToken: page1.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range append(page1.GetSessions(), page2.GetSessions()...) {
		ids = append(ids, s.GetHeader().GetId())
	}
	if want := []string{"child", id, "zz"}; !slices.Equal(ids, sortedCopy(want)) || page2.GetNextPageToken() != "" {
		t.Errorf("listed %v (next %q)", ids, page2.GetNextPageToken())
	}

	// Restart on the same data dir: the session loads and continues.
	e.restart()
	e.gw.Script(fakes.Response{Chunks: fakes.Text("after restart")})
	e.send(id, "still there?")
	e.waitIdle(id)
	evs := e.events(id)
	if err := session.CheckLog(evs); err != nil {
		t.Fatal(err)
	}
	var reasons []sessionv1.HeaderReason
	for _, ev := range evs {
		if rh := ev.GetRequestHeader(); rh != nil {
			reasons = append(reasons, rh.GetReason())
		}
	}
	if want := []sessionv1.HeaderReason{sessionv1.HeaderReason_HEADER_REASON_INITIAL, sessionv1.HeaderReason_HEADER_REASON_RESUME}; !slices.Equal(reasons, want) {
		t.Errorf("header reasons %v, want %v", reasons, want)
	}
	if last := evs[len(evs)-1].GetTurnEnd(); last.GetTurn() != 2 || last.GetReason().GetCompleted() == nil {
		t.Errorf("last event %v", evs[len(evs)-1])
	}
}

func TestIdleUnloadAndReload(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(c *agent.Config) { c.IdleUnload = 20 * time.Millisecond })
	e.create("u1")
	e.send("u1", "hi")
	e.waitIdle("u1")
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := e.client.ListSessions(t.Context(), &agentv1.ListSessionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSessions()) == 1 && resp.GetSessions()[0].GetStatus() == agentv1.AgentStatus_AGENT_STATUS_UNLOADED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session never unloaded: %v", resp)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Unloading ends the session on the toolhost (its background tasks die).
	for !slices.Contains(e.host.Ended(), "u1") {
		if time.Now().After(deadline) {
			t.Fatalf("toolhost never told session u1 ended: %v", e.host.Ended())
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.send("u1", "again")
	s := e.waitIdle("u1")
	if s.GetNextSeq() < 20 {
		t.Errorf("reloaded session has %d events", s.GetNextSeq())
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// TestEventsReachNATS runs the agent with the NATS fan-out: every durable
// event of a session is on JetStream, once, in seq order.
func TestEventsReachNATS(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(c *agent.Config) { c.Sink = nil }, fakes.Tool{Name: "echo"})
	e.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c1", Name: "echo", Args: `{}`})}, fakes.Response{Chunks: fakes.Text("done")})
	e.create("n1")
	e.send("n1", "hi")
	e.waitIdle("n1")
	want := len(e.events("n1"))
	e.stop() // Close publishes what is pending

	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(t.Context(), events.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.EventSubject("", "n1")}})
	if err != nil {
		t.Fatal(err)
	}
	var got []*sessionv1.SessionEvent
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		batch, err := cons.Fetch(want-len(got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			id, ev, err := events.DecodeEvent(m.Headers(), m.Data())
			if err != nil || id != "n1" {
				t.Fatalf("decode: %v %q", err, id)
			}
			got = append(got, ev)
		}
	}
	if len(got) != want {
		t.Fatalf("NATS has %d events, the log %d", len(got), want)
	}
	for i, ev := range got {
		if ev.GetSeq() != int64(i) {
			t.Fatalf("event %d has seq %d", i, ev.GetSeq())
		}
	}
}

func (e *env) shutdownTimeout() time.Duration {
	if e.shutdown > 0 {
		return e.shutdown
	}
	return 10 * time.Second
}

// TestGracefulShutdown: queued sends still run while the agent shuts down;
// a turn that cannot finish before the deadline ends as disposed and the
// session continues after the restart.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	e := newEnv(t, fakes.Tool{Name: "hang", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		select {
		case <-ctx.Done():
			return nil
		case <-release:
			return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{session.Text("released")}}
		}
	}})
	e.gw.Default = func(*llmv1.GenerateRequest) fakes.Response {
		wait := make(chan struct{})
		time.AfterFunc(30*time.Millisecond, func() { close(wait) })
		return fakes.Response{Wait: wait, Chunks: fakes.Text("slowly")}
	}
	e.create("g")
	for i := range 3 {
		e.send("g", fmt.Sprint("prompt ", i))
	}
	e.shutdown = 2 * time.Second // for the next instance
	e.restart()                  // graceful: the three queued turns complete first
	evs := e.events("g")
	completed := 0
	for _, ev := range evs {
		if ev.GetTurnEnd().GetReason().GetCompleted() != nil {
			completed++
		}
	}
	if completed != 3 {
		t.Fatalf("%d turns completed across a graceful restart, want 3: %v", completed, types(evs))
	}

	e.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "h1", Name: "hang", Args: `{}`})})
	e.send("g", "hang forever")
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Contains(types(e.events("g")), "tool/call") {
		if time.Now().After(deadline) {
			t.Fatal("no tool call")
		}
		time.Sleep(2 * time.Millisecond)
	}
	t0 := time.Now()
	e.restart()
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("shutdown with a hung turn took %v; the deadline was 2s", d)
	}
	evs = e.events("g")
	if err := session.CheckLog(evs); err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1].GetTurnEnd()
	if last.GetTurn() != 4 || last.GetReason().GetDisposed() == nil {
		t.Fatalf("the hung turn ended %v, want disposed", evs[len(evs)-1])
	}
	close(release)
}

func TestWaitIdleDeadlineAndIdleCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakes.Tool{Name: "hang", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		<-ctx.Done()
		return nil
	}})
	e.create("w")
	if resp, err := e.client.Cancel(t.Context(), &agentv1.CancelRequest{SessionId: "w"}); err != nil || resp.GetEffective() {
		t.Fatalf("cancel while idle with nothing pending: %v %v", resp, err)
	}
	e.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "h", Name: "hang", Args: `{}`})})
	e.send("w", "hang")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := e.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "w"}); code(err) != codes.DeadlineExceeded {
		t.Fatalf("wait idle on a running session: %v, want DeadlineExceeded", err)
	}
	got, err := e.client.GetSession(t.Context(), &agentv1.GetSessionRequest{SessionId: "w"})
	if err != nil || got.GetSession().GetStatus() != agentv1.AgentStatus_AGENT_STATUS_RUNNING || got.GetSession().OpenTurn == nil {
		t.Fatalf("running session: %v %v", got, err)
	}
	if resp, err := e.client.Cancel(t.Context(), &agentv1.CancelRequest{SessionId: "w", Cause: agentv1.CancelCause_CANCEL_CAUSE_PARENT}); err != nil || !resp.GetEffective() {
		t.Fatalf("cancel: %v %v", resp, err)
	}
	if s := e.waitIdle("w"); s.GetStatus() != agentv1.AgentStatus_AGENT_STATUS_IDLE || s.OpenTurn != nil {
		t.Fatalf("after cancel: %v", s)
	}
}

func FuzzParseRemote(f *testing.F) {
	for _, s := range []string{"policy=127.0.0.1:9000", "127.0.0.1:9000,timeout=2s,fail=open", "x=,fail=closed", "a=b,timeout=-1s", "a=b,bogus=1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := agent.ParseRemote(s)
		if err == nil && (r.Addr == "" || r.Timeout <= 0) {
			t.Fatalf("accepted %q as %+v", s, r)
		}
	})
}

// TestQueueBounds: the inbox is bounded per session (items, bytes) and per
// process; beyond a bound Send and Steer are RESOURCE_EXHAUSTED naming the
// limit, and the bounds come back when queued items run or are cancelled.
func TestQueueBounds(t *testing.T) {
	e := newEnvWith(t, func(c *agent.Config) {
		c.MaxQueuedItems, c.MaxQueuedBytes = 3, 4096
		c.ProcessMaxQueuedItems = 5
	})
	release := make(chan struct{})
	e.gw.Script(fakes.Response{Wait: release, Chunks: fakes.Text("first")})
	e.create("a")
	e.create("b")
	e.send("a", "claimed at once")
	// The first turn holds the driver; wait until its model call arrived.
	for deadline := time.Now().Add(10 * time.Second); len(e.gw.Requests()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the first turn never reached the gateway")
		}
		runtime.Gosched()
	}
	sendText := func(id, text string) error {
		_, err := e.client.Send(t.Context(), &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(text)}})
		return err
	}
	steer := func(id, text string) error {
		_, err := e.client.Steer(t.Context(), &agentv1.SteerRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(text)}})
		return err
	}
	wantFull := func(err error, sub string) {
		t.Helper()
		if code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), sub) {
			t.Fatalf("got %v, want RESOURCE_EXHAUSTED containing %q", err, sub)
		}
	}
	for i := range 2 {
		if err := sendText("a", fmt.Sprint("queued ", i)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := steer("a", "steering counts too"); err != nil {
		t.Fatalf("steer: %v", err)
	}
	wantFull(sendText("a", "one too many"), "session queue full: the limit of 3 queued items")
	wantFull(steer("a", "one too many"), "the limit of 3 queued items")
	wantFull(sendText("b", strings.Repeat("x", 5000)), "the limit of 4096 queued bytes")
	// Session b is idle: its first send is admitted, then claimed.
	if err := sendText("b", "b1"); err != nil {
		t.Fatal(err)
	}
	e.waitIdle("b")
	if err := sendText("b", "b2"); err != nil {
		t.Fatal(err)
	}
	e.waitIdle("b")
	// Cancel returns a's bounds; then they hold again.
	if _, err := e.client.Cancel(t.Context(), &agentv1.CancelRequest{SessionId: "a"}); err != nil {
		t.Fatal(err)
	}
	close(release)
	e.waitIdle("a")
	for i := range 3 {
		if err := sendText("a", fmt.Sprint("again ", i)); err != nil {
			t.Fatalf("after cancel, send %d: %v", i, err)
		}
	}
	e.waitIdle("a")
}

// TestProcessQueueBound: sessions share the process-wide bound.
func TestProcessQueueBound(t *testing.T) {
	e := newEnvWith(t, func(c *agent.Config) { c.ProcessMaxQueuedItems = 2 })
	release := make(chan struct{})
	e.gw.Default = func(*llmv1.GenerateRequest) fakes.Response {
		return fakes.Response{Wait: release, Chunks: fakes.Text("ok")}
	}
	for _, id := range []string{"a", "b", "c"} {
		e.create(id)
	}
	// a and b each run a turn (claimed: not queued) and queue one more.
	for _, id := range []string{"a", "b"} {
		e.send(id, "runs")
	}
	for deadline := time.Now().Add(10 * time.Second); len(e.gw.Requests()) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("turns never reached the gateway")
		}
		runtime.Gosched()
	}
	e.send("a", "queued")
	e.send("b", "queued")
	_, err := e.client.Send(t.Context(), &agentv1.SendRequest{SessionId: "c", Content: []*llmv1.ContentBlock{session.Text("refused")}})
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "process queue full") {
		t.Fatalf("got %v, want the process bound", err)
	}
	close(release)
	for _, id := range []string{"a", "b"} {
		e.waitIdle(id)
	}
	e.send("c", "admitted once the others ran")
	e.waitIdle("c")
}
