package k8s

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/testpki"
)

// nopCursors keeps publish cursors in memory.
type nopCursors struct{}

func (nopCursors) PublishedCursor(context.Context, string) (int64, error) { return 0, nil }
func (nopCursors) SetPublishedCursor(context.Context, string, int64) error {
	return nil
}

// seedFile makes a user nkey, writes its seed and returns the file and the
// public key.
func seedFile(t *testing.T, name string) (string, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	f := filepath.Join(t.TempDir(), name+".nk")
	if err := os.WriteFile(f, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return f, pub
}

// TestNATSConfigScopesTenants runs a real nats-server with the nats.conf the
// prod overlay ships (certificate paths pointed at certificates made here,
// the public nkeys in the environment as the Secret dsh-nats-users gives
// them): the agent's nkey publishes the events of two tenants; the example
// consumer of tenant acme reads acme's and is refused globex's.
func TestNATSConfigScopesTenants(t *testing.T) {
	conf := natsConf(t, render(t, "overlays/prod").objs)
	ca := testpki.NewCA(t, "dsh")
	srv := ca.Server("nats", testpki.Loopback())
	client := ca.Client("client", testpki.Names{URIs: []string{"spiffe://dsh/agent"}})
	dir := t.TempDir()
	for name, b := range map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": ca.CertPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf = strings.ReplaceAll(conf, "/etc/nats/tls/", dir+"/")
	// The monitor's fixed loopback port, made random for the test.
	if !strings.Contains(conf, `http: "127.0.0.1:8222"`) {
		t.Fatal("nats.conf: the monitor does not listen on the pod's loopback")
	}
	conf = strings.ReplaceAll(conf, `http: "127.0.0.1:8222"`, `http: "127.0.0.1:-1"`)
	agentSeed, agentPub := seedFile(t, "agent")
	acmeSeed, acmePub := seedFile(t, "acme")
	t.Setenv("AGENT_NKEY", agentPub)
	t.Setenv("ACME_NKEY", acmePub)
	ns := natstest.StartWith(t, natstest.Options{Config: conf})

	tlsConn := events.Conn{URL: ns.URL(), TLSCAFile: ca.CertFile, TLSCertFile: client.CertFile, TLSKeyFile: client.KeyFile}
	agentConn := tlsConn
	agentConn.NKeySeedFile = agentSeed
	pub, err := events.New(t.Context(), events.Config{Conn: agentConn, Store: nopCursors{}})
	if err != nil {
		t.Fatal(err)
	}
	ev := []*sessionv1.SessionEvent{{Seq: 0, Payload: &sessionv1.SessionEvent_StepStart{StepStart: &sessionv1.StepStart{Turn: 1}}}}
	pub.Durable("acme", "a-1", ev)
	pub.Durable("globex", "g-1", ev)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := pub.Close(ctx); err != nil {
		t.Fatalf("the agent's nkey could not publish under the shipped config: %v", err)
	}

	acme := tlsConn
	acme.NKeySeedFile = acmeSeed
	acme.InboxPrefix = events.TenantInboxPrefix("acme")
	opts, err := acme.Options()
	if err != nil {
		t.Fatal(err)
	}
	// The refusals below arrive as async errors; they are read from LastError.
	nc, err := nats.Connect(acme.URL, append(opts, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// max_payload matches the agent's largest request (gRPC's 4 MiB).
	if got := nc.MaxPayload(); got != 4<<20 {
		t.Errorf("the shipped config's max_payload is %d, want %d", got, 4<<20)
	}
	js, _ := jetstream.New(nc)
	cons, err := js.OrderedConsumer(t.Context(), events.StreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.TenantEvents("acme")}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatalf("acme's consumer refused on its own events: %v", err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil || m.Subject() != events.EventSubject("acme", "a-1") {
		t.Fatalf("acme read %v (%v), want its session's event", m, err)
	}

	// The attacks: globex's events through a consumer and a subscription.
	cctx, ccancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer ccancel()
	if _, err := js.OrderedConsumer(cctx, events.StreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.TenantEvents("globex")}, DeliverPolicy: jetstream.DeliverAllPolicy}); err == nil {
		t.Fatal("acme created a consumer on globex's events")
	}
	if _, err := nc.SubscribeSync(events.TenantEvents("globex")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		t.Fatalf("acme subscribed to globex's events: last error %v", err)
	}
}
