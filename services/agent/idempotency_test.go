package agent_test

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
)

// replyCutter is a TCP proxy to the agent that lets every byte through
// except the first response it sees: on the first HTTP/2 HEADERS frame the
// server sends (a unary reply's headers, written only after the handler
// returned) it closes both connections, so the client loses a reply the
// server committed. Later connections pass through untouched.
type replyCutter struct {
	lis  net.Listener
	to   string
	cuts atomic.Int32
	once sync.Once
}

func newReplyCutter(t *testing.T, to string) *replyCutter {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyCutter{lis: lis, to: to}
	t.Cleanup(func() { lis.Close() })
	go p.serve()
	return p
}

func (p *replyCutter) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		cut := false
		p.once.Do(func() { cut = true })
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() {
			defer c.Close()
			defer s.Close()
			if !cut {
				_, _ = io.Copy(c, s)
				return
			}
			var hdr [9]byte
			for {
				if _, err := io.ReadFull(s, hdr[:]); err != nil {
					return
				}
				n := int(binary.BigEndian.Uint32(append([]byte{0}, hdr[:3]...)))
				body := make([]byte, n)
				if _, err := io.ReadFull(s, body); err != nil {
					return
				}
				if hdr[3] == 0x1 { // HEADERS: the reply; drop it with the connection
					p.cuts.Add(1)
					return
				}
				if _, err := c.Write(append(hdr[:], body...)); err != nil {
					return
				}
			}
		}()
	}
}

// TestRetriedSendAfterLostReply: a client dialled with ClientServiceConfig
// whose Send reply is lost after the server queued the prompt retries on
// its own, gets a reply, and the prompt runs once; after an agent restart
// (no cache left) the same request_id is still recognised from the log.
func TestRetriedSendAfterLostReply(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.create("retried").GetHeader().GetId()

	proxy := newReplyCutter(t, e.addr)
	conn, err := grpc.NewClient(proxy.lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(agent.ClientServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := agentv1.NewAgentServiceClient(conn)
	req := &agentv1.SendRequest{SessionId: id, RequestId: "send-1", Content: []*llmv1.ContentBlock{session.Text("once")}}
	resp, err := client.Send(t.Context(), req)
	if err != nil {
		t.Fatalf("retried Send: %v", err)
	}
	if proxy.cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d replies; the test needs exactly one lost reply", proxy.cuts.Load())
	}
	if resp.GetStatus() == agentv1.AgentStatus_AGENT_STATUS_UNSPECIFIED {
		t.Errorf("retried Send answered %v", resp)
	}
	e.waitIdle(id)
	if n := turnsWith(e.events(id), "send-1"); n != 1 {
		t.Fatalf("the prompt ran %d times, want once", n)
	}

	// A restarted agent has no reply cache: the log recognises the id.
	e.restart()
	if _, err := e.client.Send(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	inj := &agentv1.InjectRequest{SessionId: id, RequestId: "inject-1", Content: []*llmv1.ContentBlock{session.Text("ctx")}}
	for range 2 {
		if _, err := e.client.Inject(t.Context(), inj); err != nil {
			t.Fatal(err)
		}
	}
	e.waitIdle(id)
	evs := e.events(id)
	if n := turnsWith(evs, "send-1"); n != 1 {
		t.Fatalf("after a restart the prompt ran %d times, want once", n)
	}
	if n := countRequest(evs, "inject-1"); n != 1 {
		t.Fatalf("the injection was recorded %d times, want once", n)
	}
	e.restart()
	if _, err := e.client.Inject(t.Context(), inj); err != nil {
		t.Fatal(err)
	}
	if n := countRequest(e.events(id), "inject-1"); n != 1 {
		t.Fatalf("after a restart the injection was recorded %d times, want once", n)
	}
	// A new request id is a new prompt.
	req.RequestId = "send-2"
	if _, err := e.client.Send(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	e.waitIdle(id)
	if n := turnsWith(e.events(id), "send-2"); n != 1 {
		t.Fatalf("a new request id ran %d times, want once", n)
	}
}

func turnsWith(evs []*sessionv1.SessionEvent, rid string) int {
	n := 0
	for _, ev := range evs {
		if ev.GetTurnStart() != nil && ev.GetRequestId() == rid {
			n++
		}
	}
	return n
}

func countRequest(evs []*sessionv1.SessionEvent, rid string) int {
	n := 0
	for _, ev := range evs {
		if ev.GetRequestId() == rid {
			n++
		}
	}
	return n
}

// TestIdempotentCreateSession: a CreateSession retried with the same
// request_id answers with the session the first call made, before and after
// a restart, with or without a caller-chosen id; another request_id with
// that id is ALREADY_EXISTS; a request_id too long or with control
// characters is INVALID_ARGUMENT.
func TestIdempotentCreateSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	create := func(id, rid string) (*agentv1.Session, error) {
		resp, err := e.client.CreateSession(t.Context(), &agentv1.CreateSessionRequest{SessionId: id, RequestId: rid,
			Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
		return resp.GetSession(), err
	}
	first, err := create("", "create-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := create("named", "create-2"); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		again, err := create("", "create-1")
		if err != nil || again.GetHeader().GetId() != first.GetHeader().GetId() {
			t.Fatalf("round %d: retry made %v, %v; want session %s", round, again.GetHeader().GetId(), err, first.GetHeader().GetId())
		}
		again, err = create("named", "create-2")
		if err != nil || again.GetHeader().GetId() != "named" {
			t.Fatalf("round %d: retry of a named create: %v, %v", round, again, err)
		}
		if _, err := create("named", "create-3"); code(err) != codes.AlreadyExists {
			t.Fatalf("round %d: another request with the id: %v, want ALREADY_EXISTS", round, err)
		}
		if _, err := create("named", ""); code(err) != codes.AlreadyExists {
			t.Fatalf("round %d: a create without request_id: %v, want ALREADY_EXISTS", round, err)
		}
		e.restart()
	}
	for _, bad := range []string{strings.Repeat("r", 129), "a\x00b"} {
		if _, err := create("", bad); code(err) != codes.InvalidArgument {
			t.Errorf("request_id %q: %v, want INVALID_ARGUMENT", bad, err)
		}
		_, err := e.client.Send(t.Context(), &agentv1.SendRequest{SessionId: "named", RequestId: bad, Content: []*llmv1.ContentBlock{session.Text("x")}})
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "request_id") {
			t.Errorf("Send request_id %q: %v, want INVALID_ARGUMENT naming request_id", bad, err)
		}
	}
}

// TestServiceConfigDocumented: docs/API.md shows the service config clients
// should use, verbatim.
func TestServiceConfigDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/API.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), agent.ClientServiceConfig) {
		t.Fatal("docs/API.md does not show agent.ClientServiceConfig verbatim")
	}
}
