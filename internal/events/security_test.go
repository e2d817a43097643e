package events_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/testpki"
)

// secureNATS is a real nats-server configured the way deploy/k8s configures
// it: TLS with client certificates from a CA made in the test, one account
// holding the stream, the agent authenticated by an nkey and allowed to
// publish dsh.>, and one consumer user per tenant (user/password) scoped to
// its tenant's subjects and inboxes.
type secureNATS struct {
	srv       *natstest.Server
	ca        *testpki.CA
	client    *testpki.Leaf
	agentSeed string // file
	passwords map[string]string
}

// tenantPermissions is the permission block of a tenant's consumer
// (events.ConsumerPermissions) in the nats-server config format.
func tenantPermissions(tenant string) string {
	return natstest.Permissions(events.ConsumerPermissions(tenant))
}

func startSecureNATS(t *testing.T) *secureNATS {
	t.Helper()
	ca := testpki.NewCA(t, "nats")
	srvCert := ca.Server("nats-server", testpki.Loopback())
	s := &secureNATS{ca: ca, client: ca.Client("nats-client", testpki.Names{CommonName: "dsh"}),
		passwords: map[string]string{"acme": "acme-" + t.Name(), "globex": "globex-" + t.Name()}}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	s.agentSeed = filepath.Join(t.TempDir(), "agent.nk")
	if err := os.WriteFile(s.agentSeed, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
}
accounts {
  DSH {
    jetstream: enabled
    users: [
      { nkey: %q, permissions: %s }
      { user: acme, password: %q, permissions: %s }
      { user: globex, password: %q, permissions: %s }
    ]
  }
}
`, srvCert.CertFile, srvCert.KeyFile, ca.CertFile, pub, natstest.Permissions(events.AgentPermissions()),
		s.passwords["acme"], tenantPermissions("acme"), s.passwords["globex"], tenantPermissions("globex"))
	s.srv = natstest.StartWith(t, natstest.Options{Config: conf})
	return s
}

// conn is the connection options of a tenant's consumer.
func (s *secureNATS) conn(tenant string) events.Conn {
	return events.Conn{URL: s.srv.URL(), User: tenant, Password: s.passwords[tenant],
		TLSCAFile: s.ca.CertFile, TLSCertFile: s.client.CertFile, TLSKeyFile: s.client.KeyFile,
		InboxPrefix: events.TenantInboxPrefix(tenant)}
}

func (s *secureNATS) agentConn() events.Conn {
	return events.Conn{URL: s.srv.URL(), NKeySeedFile: s.agentSeed,
		TLSCAFile: s.ca.CertFile, TLSCertFile: s.client.CertFile, TLSKeyFile: s.client.KeyFile}
}

func connect(t *testing.T, c events.Conn, extra ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts, err := c.Options()
	if err != nil {
		t.Fatal(err)
	}
	return nats.Connect(c.URL, append(opts, extra...)...)
}

// TestTenantScopedConsumers publishes two tenants' sessions through an
// agent authenticated by nkey over mTLS, then checks that each tenant's
// consumer reads its own events and statuses, and that every way for tenant
// A to reach tenant B's subjects is refused by the server.
func TestTenantScopedConsumers(t *testing.T) {
	t.Parallel()
	s := startSecureNATS(t)

	// Each tenant's consumer subscribes to its own status before anything
	// is published (status is core NATS, at most once).
	statusOf := map[string]*nats.Subscription{}
	for _, tenant := range []string{"acme", "globex"} {
		nc, err := connect(t, s.conn(tenant))
		if err != nil {
			t.Fatalf("%s connects: %v", tenant, err)
		}
		defer nc.Close()
		sub, err := nc.SubscribeSync(events.TenantStatus(tenant))
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		statusOf[tenant] = sub
	}

	p := newPublisher(t, "", newMemStore(), func(c *events.Config) { c.Conn = s.agentConn() })
	p.Durable("acme", "a-1", mkEvents(0, 4))
	p.Durable("globex", "g-1", mkEvents(0, 3))
	p.Status("acme", "a-1", agentv1.AgentStatus_AGENT_STATUS_IDLE)
	p.Status("globex", "g-1", agentv1.AgentStatus_AGENT_STATUS_IDLE)
	flush(t, p)

	for tenant, want := range map[string]struct {
		id string
		n  int
	}{"acme": {"a-1", 4}, "globex": {"g-1", 3}} {
		nc, err := connect(t, s.conn(tenant))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		cons, err := js.OrderedConsumer(t.Context(), events.StreamName, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{events.TenantEvents(tenant)}, DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			t.Fatalf("%s: own consumer refused: %v", tenant, err)
		}
		for i := range want.n {
			m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
			if err != nil {
				t.Fatalf("%s: event %d: %v", tenant, i, err)
			}
			id, ev, err := events.DecodeEvent(m.Headers(), m.Data())
			if err != nil || id != want.id || ev.GetSeq() != int64(i) {
				t.Fatalf("%s: got %s seq %d (%v), want %s seq %d", tenant, id, ev.GetSeq(), err, want.id, i)
			}
		}
		if m, err := cons.Next(jetstream.FetchMaxWait(200 * time.Millisecond)); err == nil {
			t.Fatalf("%s: an extra message on %s", tenant, m.Subject())
		}
		m, err := statusOf[tenant].NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: no status: %v", tenant, err)
		}
		if id, _, err := events.DecodeStatus(m.Header, m.Data); err != nil || id != want.id {
			t.Fatalf("%s: status of %q (%v), want %s", tenant, id, err, want.id)
		}
	}

	// The attacker: acme's credentials, aiming at globex.
	attacks := []struct {
		name string
		try  func(nc *nats.Conn, js jetstream.JetStream) error
	}{
		{"subscribe to globex events", func(nc *nats.Conn, _ jetstream.JetStream) error {
			return subscribeErr(nc, events.TenantEvents("globex"))
		}},
		{"subscribe to globex status", func(nc *nats.Conn, _ jetstream.JetStream) error {
			return subscribeErr(nc, events.TenantStatus("globex"))
		}},
		{"subscribe to every tenant", func(nc *nats.Conn, _ jetstream.JetStream) error { return subscribeErr(nc, events.AllEvents) }},
		{"subscribe to globex inboxes", func(nc *nats.Conn, _ jetstream.JetStream) error {
			return subscribeErr(nc, events.TenantInboxPrefix("globex")+".>")
		}},
		{"subscribe to the agent's inboxes", func(nc *nats.Conn, _ jetstream.JetStream) error { return subscribeErr(nc, "_INBOX.>") }},
		{"consumer on globex events", func(_ *nats.Conn, js jetstream.JetStream) error {
			return consumerErr(t, js, events.TenantEvents("globex"))
		}},
		{"consumer on one globex session", func(_ *nats.Conn, js jetstream.JetStream) error {
			return consumerErr(t, js, events.EventSubject("globex", "g-1"))
		}},
		{"consumer on every tenant", func(_ *nats.Conn, js jetstream.JetStream) error {
			return consumerErr(t, js, events.AllEvents)
		}},
		{"consumer on any session id", func(_ *nats.Conn, js jetstream.JetStream) error {
			return consumerErr(t, js, events.SessionEvents("g-1"))
		}},
		{"read a stored message directly", func(_ *nats.Conn, js jetstream.JetStream) error {
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			_, err := js.Stream(ctx, events.StreamName)
			return err
		}},
		{"publish as the agent", func(nc *nats.Conn, _ jetstream.JetStream) error {
			return publishErr(nc, events.EventSubject("globex", "g-1"))
		}},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			var async = make(chan error, 4)
			nc, err := connect(t, s.conn("acme"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { async <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			err = a.try(nc, js)
			if err == nil {
				select {
				case err = <-async:
				case <-time.After(2 * time.Second):
				}
			}
			if err == nil {
				t.Fatal("acme crossed into globex: no error")
			}
			// A refused JetStream request times out; the server says why
			// on the connection.
			if last := nc.LastError(); last != nil {
				err = last
			}
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("refused for the wrong reason: %v", err)
			}
		})
	}
}

// subscribeErr subscribes and reports the server's permissions violation.
func subscribeErr(nc *nats.Conn, subj string) error {
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	if _, err := sub.NextMsg(10 * time.Millisecond); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return err
	}
	return nc.LastError()
}

// consumerErr tries to create an ordered consumer filtered to subj.
func consumerErr(t *testing.T, js jetstream.JetStream, subj string) error {
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return err
	}
	if m, err := c.Next(jetstream.FetchMaxWait(time.Second)); err == nil {
		return fmt.Errorf("read %s (nil error means the attack worked)", m.Subject())
	}
	return nil
}

func publishErr(nc *nats.Conn, subj string) error {
	if err := nc.Publish(subj, []byte("forged")); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	return nc.LastError()
}

// TestRefusedWithoutCredentials: the secured server refuses a client
// without a client certificate, with a wrong password, or with an nkey it
// does not know; and the publisher, given bad credentials, keeps the events
// queued (nothing lost) rather than failing the agent.
func TestRefusedWithoutCredentials(t *testing.T) {
	t.Parallel()
	s := startSecureNATS(t)
	other := testpki.NewCA(t, "other")
	otherClient := other.Client("intruder", testpki.Names{CommonName: "intruder"})
	stranger, _ := nkeys.CreateUser()
	seed, _ := stranger.Seed()
	strangerSeed := filepath.Join(t.TempDir(), "stranger.nk")
	if err := os.WriteFile(strangerSeed, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	good := s.conn("acme")
	tests := []struct {
		name string
		mod  func(c *events.Conn)
	}{
		{"no tls at all", func(c *events.Conn) { c.TLSCAFile, c.TLSCertFile, c.TLSKeyFile = "", "", "" }},
		{"no client certificate", func(c *events.Conn) { c.TLSCertFile, c.TLSKeyFile = "", "" }},
		{"client certificate of another CA", func(c *events.Conn) { c.TLSCertFile, c.TLSKeyFile = otherClient.CertFile, otherClient.KeyFile }},
		{"wrong password", func(c *events.Conn) { c.Password = "guess" }},
		{"unknown nkey", func(c *events.Conn) { c.User, c.Password, c.NKeySeedFile = "", "", strangerSeed }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := good
			tt.mod(&c)
			nc, err := connect(t, c, nats.Timeout(2*time.Second))
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if strings.Contains(err.Error(), good.Password) {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}

	t.Run("publisher keeps events on refusal", func(t *testing.T) {
		t.Parallel()
		bad := s.agentConn()
		bad.NKeySeedFile = strangerSeed
		store := newMemStore()
		p, err := events.New(t.Context(), events.Config{Conn: bad, Store: store})
		if err != nil {
			t.Fatalf("a refusing server must not fail the agent: %v", err)
		}
		p.Durable("acme", "kept", mkEvents(0, 5))
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if err := p.Close(ctx); err == nil || !strings.Contains(err.Error(), "5 events unpublished") {
			t.Fatalf("Close = %v, want the 5 events reported unpublished", err)
		}
		if c := store.cursor("kept"); c != 0 {
			t.Fatalf("cursor moved to %d although nothing reached the stream", c)
		}
	})
}
