package clients_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
)

// readerScript reads with dsh_toolhost.events.read_events (from the
// checkout) and prints "<seq> <type>" per event, or "refused: <error>".
const readerScript = `
import sys
from dsh_toolhost.events import read_events, session_subject
url, sid, tenant, inbox = sys.argv[1:5]
try:
    for ev in read_events(url, session_subject(sid, tenant=tenant), timeout=20, inbox_prefix=inbox):
        print(ev.seq, ev.type, ev.event.WhichOneof("payload"), flush=True)
        if ev.type == "turn/end":
            break
except ConnectionError as e:
    print("refused:", e)
`

// TestPythonReaderTenantScope checks the Python DSH_EVENTS reader against a
// NATS server configured as a deployment is (internal/events permissions): a
// tenant's user reads its own sessions' events, in order, and every attempt
// to read another tenant's, to use an inbox outside its prefix, or to log in
// with a wrong password is refused by the server, and the reader says so.
func TestPythonReaderTenantScope(t *testing.T) {
	conf := fmt.Sprintf(`
accounts {
  DSH {
    jetstream: enabled
    users: [
      { user: agent, password: "agent-pw", permissions: %s }
      { user: acme, password: "acme-pw", permissions: %s }
    ]
  }
}
`, natstest.Permissions(events.AgentPermissions()), natstest.Permissions(events.ConsumerPermissions("acme")))
	srv := natstest.StartWith(t, natstest.Options{Config: conf})
	nc, err := nats.Connect(srv.URL(), nats.UserInfo("agent", "agent-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{events.AllEvents}}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		for seq, ev := range []*sessionv1.SessionEvent{
			{Payload: &sessionv1.SessionEvent_TurnStart{TurnStart: &sessionv1.TurnStart{Turn: 1}}},
			{Payload: &sessionv1.SessionEvent_UserMessage{UserMessage: &sessionv1.UserMessage{}}},
			{Payload: &sessionv1.SessionEvent_TurnEnd{TurnEnd: &sessionv1.TurnEnd{Turn: 1}}},
		} {
			ev.Seq = int64(seq)
			m, err := events.EncodeEvent(tenant, "s."+tenant, ev) // a '.' in the id must be escaped
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	host := strings.TrimPrefix(srv.URL(), "nats://")
	cases := []struct {
		name, user, sid, tenant, inbox, want string
	}{
		{"own tenant", "acme:acme-pw", "s.acme", "acme", "_INBOX_acme",
			"0 turn/start turn_start\n1 user/message user_message\n2 turn/end turn_end"},
		{"another tenant's session", "acme:acme-pw", "s.globex", "globex", "_INBOX_acme", "refused: nats: 'Permissions Violation for Publish to"},
		{"any tenant", "acme:acme-pw", "s.acme", "*", "_INBOX_acme", "refused: nats: 'Permissions Violation for Publish to"},
		{"an inbox outside its prefix", "acme:acme-pw", "s.acme", "acme", "_INBOX_globex", "refused: nats: 'Permissions Violation for Subscription to"},
		{"wrong password", "acme:nope", "s.acme", "acme", "_INBOX_acme", "refused: nats: 'Authorization Violation'"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-c", readerScript, "nats://"+c.user+"@"+host, c.sid, c.tenant, c.inbox)
			cmd.Env = baseEnv([]string{"PYTHONPATH=" + filepath.Join(repoRoot(t), "sdk", "python")})
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("reader: %v\n%s", err, out)
			}
			t.Logf("reader printed:\n%s", out)
			if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, c.want) {
				t.Errorf("reader printed:\n%s\nwant (prefix):\n%s", got, c.want)
			}
		})
	}
}
