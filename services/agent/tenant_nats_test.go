package agent_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// TestSessionsPublishUnderTheirTenant: the agent publishes a session's
// events and status on dsh.{events,status}.<header.tenant>.<id>. A session
// of tenant acme (stored by an earlier process, as tenancy sets it at
// creation) is caught up at start and published under acme only; a session
// without a tenant goes under default.
func TestSessionsPublishUnderTheirTenant(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(c *agent.Config) { c.Sink = nil })
	e.gw.Script(fakes.Response{Chunks: fakes.Text("one")}, fakes.Response{Chunks: fakes.Text("two")})
	e.create("plain")
	e.send("plain", "hi")
	e.waitIdle("plain")
	e.stop()

	// Store a copy of the session as tenant acme's, as a tenant-aware
	// agent would have created it.
	st, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: filepath.Join(e.dir, "sessions.db")})
	if err != nil {
		t.Fatal(err)
	}
	h, evs, err := st.Load(t.Context(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	h = proto.CloneOf(h)
	h.Id, h.Tenant = "owned", "acme"
	if err := st.Create(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	if err := st.Append(t.Context(), "owned", evs); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	status, err := nc.SubscribeSync(events.TenantStatus("acme"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.send("owned", "again") // a live turn of the acme session: events and status
	e.waitIdle("owned")
	e.stop()

	js, _ := jetstream.New(nc)
	stream, err := js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	count := func(subject string) uint64 {
		info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}
	owned := count(events.EventSubject("acme", "owned"))
	if owned <= uint64(len(evs)) {
		t.Fatalf("dsh.events.acme.owned holds %d events, want the %d stored plus the new turn's", owned, len(evs))
	}
	if n := count(events.SessionEvents("owned")); n != owned {
		t.Fatalf("session owned has %d events on other tenants' subjects", n-owned)
	}
	if n := count(events.EventSubject("", "plain")); n != uint64(len(evs)) {
		t.Fatalf("dsh.events.default.plain holds %d events, want %d", n, len(evs))
	}
	if n := count(events.TenantEvents("acme")); n != owned {
		t.Fatalf("acme's subjects hold %d events, want only owned's %d", n, owned)
	}
	m, err := status.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no status on acme's status subjects: %v", err)
	}
	if id, _, err := events.DecodeStatus(m.Header, m.Data); err != nil || id != "owned" || m.Subject != events.StatusSubject("acme", "owned") {
		t.Fatalf("status %s of %q (%v)", m.Subject, id, err)
	}
}
