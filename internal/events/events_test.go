package events_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// memStore is a hand-written Cursors (and, with reader set, Reader).
type memStore struct {
	mu      sync.Mutex
	cursors map[string]int64
	logs    map[string][]*sessionv1.SessionEvent
}

func newMemStore() *memStore {
	return &memStore{cursors: map[string]int64{}, logs: map[string][]*sessionv1.SessionEvent{}}
}

func (m *memStore) PublishedCursor(_ context.Context, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cursors[id], nil
}

func (m *memStore) SetPublishedCursor(_ context.Context, id string, next int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if next > m.cursors[id] {
		m.cursors[id] = next
	}
	return nil
}

func (m *memStore) cursor(id string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cursors[id]
}

// readerStore adds Reader to memStore.
type readerStore struct{ *memStore }

func (r readerStore) ReadEvents(_ context.Context, id string, from int64) ([]*sessionv1.SessionEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	log := r.logs[id]
	if from >= int64(len(log)) {
		return nil, nil
	}
	return append([]*sessionv1.SessionEvent(nil), log[from:]...), nil
}

func mkEvents(from, to int64) []*sessionv1.SessionEvent {
	var out []*sessionv1.SessionEvent
	for seq := from; seq < to; seq++ {
		ev := &sessionv1.SessionEvent{Seq: seq, Time: 1000 + seq}
		if seq%2 == 0 {
			ev.Payload = &sessionv1.SessionEvent_StepStart{StepStart: &sessionv1.StepStart{Turn: 1, Step: int32(seq)}}
		} else {
			ev.Payload = &sessionv1.SessionEvent_StepEnd{StepEnd: &sessionv1.StepEnd{Turn: 1, Step: int32(seq)}}
		}
		out = append(out, ev)
	}
	return out
}

func newPublisher(t *testing.T, url string, store events.Cursors, mod func(*events.Config)) *events.Publisher {
	t.Helper()
	cfg := events.Config{
		Conn:         events.Conn{URL: url, Name: t.Name()},
		Store:        store,
		Logger:       slog.New(slog.DiscardHandler),
		ExtraOptions: []nats.Option{nats.ReconnectWait(20 * time.Millisecond)},
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := events.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

func flush(t *testing.T, p *events.Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

type stored struct {
	tenant  string
	session string
	seq     int64
	typ     string
	msgID   string
	subject string
}

// readStream returns every message of the stream in stream order.
func readStream(t *testing.T, url string) []stored {
	t.Helper()
	st := eventStream(t, url)
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []stored
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		id, ev, err := events.DecodeEvent(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(events.HeaderSeq); got != strconv.FormatInt(ev.GetSeq(), 10) {
			t.Fatalf("seq header %q, payload seq %d", got, ev.GetSeq())
		}
		out = append(out, stored{tenant: m.Header.Get(events.HeaderTenant), session: id, seq: ev.GetSeq(), typ: m.Header.Get(events.HeaderEventType),
			msgID: m.Header.Get(nats.MsgIdHdr), subject: m.Subject})
	}
	return out
}

// checkExactlyOnce asserts that session id has seqs 0..n-1 exactly once, in order.
func checkExactlyOnce(t *testing.T, msgs []stored, id string, n int64) {
	t.Helper()
	var seqs []int64
	for _, m := range msgs {
		if m.session == id {
			seqs = append(seqs, m.seq)
		}
	}
	if int64(len(seqs)) != n {
		t.Fatalf("session %s: %d messages in the stream, want %d (seqs %v)", id, len(seqs), n, seqs)
	}
	for i, s := range seqs {
		if s != int64(i) {
			t.Fatalf("session %s: stream position %d holds seq %d (seqs %v)", id, i, s, seqs)
		}
	}
}

func TestPublishesInOrderWithHeaders(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	store := newMemStore()
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.BatchSize = 7 })
	ids := []string{"s-1", "s.2", "s 3"}
	tenants := map[string]string{"s-1": "", "s.2": "acme", "s 3": "a.b*>"}
	for i := int64(0); i < 50; i += 5 {
		for _, id := range ids {
			p.Durable(tenants[id], id, mkEvents(i, i+5))
		}
	}
	flush(t, p)
	msgs := readStream(t, srv.URL())
	for _, id := range ids {
		checkExactlyOnce(t, msgs, id, 50)
		if got := store.cursor(id); got != 50 {
			t.Errorf("cursor of %s = %d, want 50", id, got)
		}
	}
	for _, m := range msgs {
		if m.tenant != events.TenantToken(tenants[m.session]) {
			t.Fatalf("message %+v: tenant header, want %q", m, events.TenantToken(tenants[m.session]))
		}
		if m.subject != events.EventSubject(tenants[m.session], m.session) || m.msgID != events.MsgID(m.session, m.seq) {
			t.Fatalf("message %+v: wrong subject or msg id", m)
		}
		want := "step/start"
		if m.seq%2 == 1 {
			want = "step/end"
		}
		if m.typ != want {
			t.Fatalf("message %+v: type header %q, want %q", m, m.typ, want)
		}
	}
	// Handing the same events in again publishes nothing.
	p.Durable("", "s-1", mkEvents(0, 50))
	flush(t, p)
	if got := len(readStream(t, srv.URL())); got != 150 {
		t.Fatalf("after re-handing: %d messages, want 150", got)
	}
}

// TestDurableEncodedPublishesTheStoresBytes: events handed in with their
// encodings (the store's, persistence.EncodingAppender) are published with
// those very bytes as the body — one marshal per event — and the same
// headers as any other; without encodings, or with a count that does not
// match, the publisher encodes the events itself.
func TestDurableEncodedPublishesTheStoresBytes(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	p := newPublisher(t, srv.URL(), newMemStore(), nil)
	evs := mkEvents(0, 6)
	evs[1].Payload = &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: 1,
		Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "hi"}}}}}
	// Each encoding carries a trailing unknown field (still an encoding of
	// the event: it decodes to it), so a body equal to it can only be the
	// handed-in bytes, never a second marshal.
	pb := make([][]byte, 4)
	for i, ev := range evs[:4] {
		b, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		pb[i] = protowire.AppendBytes(protowire.AppendTag(b, 999, protowire.BytesType), []byte("store"))
	}
	p.DurableEncoded("acme", "e", evs[:4], pb)
	p.DurableEncoded("acme", "e", evs[4:], pb[:1]) // count mismatch: encoded here
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "e", 6)
	st := eventStream(t, srv.URL())
	for seq := uint64(1); seq <= 6; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		i := seq - 1
		if i < 4 && !bytes.Equal(m.Data, pb[i]) {
			t.Fatalf("seq %d: body is not the handed-in encoding", i)
		}
		if i >= 4 {
			if want, _ := proto.Marshal(evs[i]); !bytes.Equal(m.Data, want) {
				t.Fatalf("seq %d: body %x, want the event's own encoding %x", i, m.Data, want)
			}
		}
		want := nats.Header{
			events.HeaderEventType: {session.TypeName(evs[i])}, events.HeaderSeq: {strconv.FormatUint(i, 10)},
			events.HeaderSessionID: {"e"}, events.HeaderTenant: {"acme"}, nats.MsgIdHdr: {"e:" + strconv.FormatUint(i, 10)},
			jetstream.ExpectedStreamHeader: {events.StreamName},
		}
		if i == 1 {
			want[events.HeaderDelta] = []string{"1"}
		}
		if !reflect.DeepEqual(m.Header, want) {
			t.Fatalf("seq %d: headers %v, want %v", i, m.Header, want)
		}
	}
}

// TestHeldEncodingsAreBounded: the queues hold handed-in encodings up to
// Config.HeldEncodings bytes; events past it are queued without theirs and
// marshalled when published (still exactly once), and the budget is free
// again once the held ones are published.
func TestHeldEncodingsAreBounded(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	evs := mkEvents(0, 8)
	pb := make([][]byte, len(evs))
	for i, ev := range evs {
		b, _ := proto.Marshal(ev)
		pb[i] = protowire.AppendBytes(protowire.AppendTag(b, 999, protowire.BytesType), []byte("store"))
	}
	p := newPublisher(t, srv.URL(), newMemStore(), func(c *events.Config) { c.HeldEncodings = len(pb[4]) + len(pb[5]) }) // the larger pair (seq 0 encodes shorter)
	p.DurableEncoded("", "h", evs[:4], pb[:4])
	flush(t, p)
	p.DurableEncoded("", "h", evs[4:], pb[4:])
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "h", 8)
	st := eventStream(t, srv.URL())
	for seq := uint64(1); seq <= 8; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		i := seq - 1
		handed := bytes.Equal(m.Data, pb[i])
		if want := i%4 < 2; handed != want {
			t.Fatalf("seq %d: body is the handed-in encoding = %v, want %v (budget of two)", i, handed, want)
		}
	}
}

// startPublished starts a server and a publisher (on a fresh memStore)
// that has published events 0..n-1 of session id.
func startPublished(t *testing.T, id string, n int64) (*natstest.Server, *events.Publisher) {
	t.Helper()
	srv := natstest.Start(t)
	p := newPublisher(t, srv.URL(), newMemStore(), nil)
	p.Durable("", id, mkEvents(0, n))
	flush(t, p)
	return srv, p
}

func TestServerDeduplicatesByMsgID(t *testing.T) {
	t.Parallel()
	srv, _ := startPublished(t, "d", 3)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	msg, err := events.EncodeEvent("", "d", mkEvents(1, 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(t.Context(), msg)
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate {
		t.Fatal("re-publish of seq 1 was not reported as a duplicate")
	}
	checkExactlyOnce(t, readStream(t, srv.URL()), "d", 3)
}

// countingStore is a memStore that counts PublishedCursor reads.
type countingStore struct {
	*memStore
	reads atomic.Int64
}

func (c *countingStore) PublishedCursor(ctx context.Context, id string) (int64, error) {
	c.reads.Add(1)
	return c.memStore.PublishedCursor(ctx, id)
}

// TestCreatedSkipsTheCursorRead: a session the agent just created is
// published from seq 0 without reading its cursor from the store, and the
// stream's tail still decides where publishing starts (an id whose subject
// already holds events from an earlier store is published exactly once).
func TestCreatedSkipsTheCursorRead(t *testing.T) {
	t.Parallel()
	srv, _ := startPublished(t, "old", 5)
	store := &countingStore{memStore: newMemStore()}
	p := newPublisher(t, srv.URL(), store, nil)
	for _, id := range []string{"old", "new"} {
		p.Created("", id)
		p.Durable("", id, mkEvents(0, 8))
	}
	flush(t, p)
	msgs := readStream(t, srv.URL())
	checkExactlyOnce(t, msgs, "old", 8)
	checkExactlyOnce(t, msgs, "new", 8)
	if n := store.reads.Load(); n != 0 {
		t.Fatalf("%d PublishedCursor reads for created sessions, want 0", n)
	}
	if store.cursor("old") != 8 || store.cursor("new") != 8 {
		t.Fatalf("cursors %d / %d, want 8 / 8", store.cursor("old"), store.cursor("new"))
	}
	// A session not announced as created still reads its cursor.
	p.Durable("", "loaded", mkEvents(0, 2))
	flush(t, p)
	if n := store.reads.Load(); n != 1 {
		t.Fatalf("%d PublishedCursor reads after a loaded session's first publication, want 1", n)
	}
}

func TestOutageMidSession(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	store := newMemStore()
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.BatchSize = 4 })
	p.Durable("", "o", mkEvents(0, 20))
	flush(t, p)
	srv.Stop()
	for i := int64(20); i < 60; i += 3 {
		p.Durable("", "o", mkEvents(i, min(i+3, 60))) // must not block with NATS down
	}
	if got := p.Pending(); got != 40 {
		t.Fatalf("Pending during the outage = %d, want 40", got)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "o", 60)
	if got := store.cursor("o"); got != 60 {
		t.Fatalf("cursor = %d, want 60", got)
	}
}

func TestUnreachableAtStart(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.Stop()
	p := newPublisher(t, srv.URL(), newMemStore(), nil) // warns, does not fail
	p.Durable("", "u", mkEvents(0, 5))
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	flush(t, p)
	checkExactlyOnce(t, readStream(t, srv.URL()), "u", 5)
}

func TestRestartWithStaleCursor(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	store := newMemStore()
	a := newPublisher(t, srv.URL(), store, nil)
	a.Durable("", "r", mkEvents(0, 10))
	flush(t, a)
	if err := a.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A crash after JetStream acked but before the cursor was saved.
	store.mu.Lock()
	store.cursors["r"] = 3
	store.mu.Unlock()
	b := newPublisher(t, srv.URL(), store, nil)
	b.Durable("", "r", mkEvents(0, 15)) // the agent hands in the loaded log
	flush(t, b)
	checkExactlyOnce(t, readStream(t, srv.URL()), "r", 15)
	if got := store.cursor("r"); got != 15 {
		t.Fatalf("cursor = %d, want 15", got)
	}
}

func TestOverflow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		reader bool
	}{
		{name: "store reader fills the gap", reader: true},
		{name: "agent hands the log in again", reader: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t)
			mem := newMemStore()
			mem.logs["v"] = mkEvents(0, 30)
			var store events.Cursors = mem
			if tt.reader {
				store = readerStore{mem}
			}
			srv.Stop()
			p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.QueueLimit = 4; c.BatchSize = 3 })
			for i := int64(0); i < 30; i++ {
				p.Durable("", "v", mkEvents(i, i+1))
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			if !tt.reader {
				// Without a reader, only the queued head can go out until
				// the agent hands the log in again.
				ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
				err := p.Flush(ctx)
				cancel()
				if err == nil {
					t.Fatal("Flush succeeded with events missing")
				}
				checkExactlyOnce(t, readStream(t, srv.URL()), "v", 4)
				p.Durable("", "v", mkEvents(0, 30))
			}
			flush(t, p)
			checkExactlyOnce(t, readStream(t, srv.URL()), "v", 30)
		})
	}
}

func TestCatchUpSweep(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	mem := newMemStore()
	mem.logs["a"] = mkEvents(0, 12)
	mem.logs["b"] = mkEvents(0, 5)
	mem.cursors["b"] = 2 // published by an earlier process
	p := newPublisher(t, srv.URL(), readerStore{mem}, func(c *events.Config) { c.BatchSize = 5 })
	p.CatchUp(&sessionv1.SessionHeader{Id: "a", Tenant: "t1"}, &sessionv1.SessionHeader{Id: "b"})
	flush(t, p)
	msgs := readStream(t, srv.URL())
	checkExactlyOnce(t, msgs, "a", 12)
	var b []int64
	for _, m := range msgs {
		if want := map[string]string{"a": "dsh.events.t1.a", "b": "dsh.events.default.b"}[m.session]; m.subject != want {
			t.Fatalf("session %s published on %s, want %s", m.session, m.subject, want)
		}
		if m.session == "b" {
			b = append(b, m.seq)
		}
	}
	if fmt.Sprint(b) != "[2 3 4]" {
		t.Fatalf("session b published %v, want [2 3 4]", b)
	}
}

// startWithClient starts a server and connects a plain client to it.
func startWithClient(t *testing.T) (*natstest.Server, *nats.Conn) {
	t.Helper()
	srv := natstest.Start(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}

func TestStatus(t *testing.T) {
	t.Parallel()
	srv, nc := startWithClient(t)
	sub, err := nc.SubscribeSync(events.AllStatus)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, srv.URL(), newMemStore(), nil)
	p.Durable("t", "st", mkEvents(0, 2))
	p.Status("t", "st", agentv1.AgentStatus_AGENT_STATUS_RUNNING)
	p.Status("t", "st", agentv1.AgentStatus_AGENT_STATUS_IDLE)
	for _, want := range []agentv1.AgentStatus{agentv1.AgentStatus_AGENT_STATUS_RUNNING, agentv1.AgentStatus_AGENT_STATUS_IDLE} {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		id, st, err := events.DecodeStatus(m.Header, m.Data)
		if err != nil || id != "st" || st != want || m.Subject != "dsh.status.t.st" || m.Header.Get(events.HeaderTenant) != "t" {
			t.Fatalf("status message %s %q: id %q status %v err %v; want %v", m.Subject, m.Data, id, st, err, want)
		}
	}
	// The events queued before IDLE are already in the stream.
	checkExactlyOnce(t, readStream(t, srv.URL()), "st", 2)
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("not a credential"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		conn     events.Conn
		wantFlag string
	}{
		{name: "empty url", conn: events.Conn{}, wantFlag: events.FlagURL},
		{name: "http scheme", conn: events.Conn{URL: "http://127.0.0.1:4222"}, wantFlag: events.FlagURL},
		{name: "second url bad", conn: events.Conn{URL: "nats://a:1,localhost:2"}, wantFlag: events.FlagURL},
		{name: "missing creds", conn: events.Conn{URL: "nats://a:1", CredsFile: filepath.Join(dir, "nope.creds")}, wantFlag: events.FlagCreds},
		{name: "junk creds", conn: events.Conn{URL: "nats://a:1", CredsFile: junk}, wantFlag: events.FlagCreds},
		{name: "junk nkey", conn: events.Conn{URL: "nats://a:1", NKeySeedFile: junk}, wantFlag: events.FlagNKey},
		{name: "junk ca", conn: events.Conn{URL: "tls://a:1", TLSCAFile: junk}, wantFlag: events.FlagTLSCA},
		{name: "cert without key", conn: events.Conn{URL: "tls://a:1", TLSCertFile: junk}, wantFlag: events.FlagTLSCert},
		{name: "user without password", conn: events.Conn{URL: "nats://a:1", User: "agent"}, wantFlag: events.FlagUser},
		{name: "password without user", conn: events.Conn{URL: "nats://a:1", Password: "s3cret"}, wantFlag: events.FlagUser},
		{name: "user and nkey", conn: events.Conn{URL: "nats://a:1", User: "agent", Password: "s3cret", NKeySeedFile: junk}, wantFlag: events.FlagUser},
		{name: "wildcard inbox", conn: events.Conn{URL: "nats://a:1", InboxPrefix: "_INBOX.*"}, wantFlag: events.FlagInbox},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := events.New(t.Context(), events.Config{Conn: tt.conn, Store: newMemStore()})
			var oe *events.OptionError
			if !errors.As(err, &oe) {
				t.Fatalf("New error = %v, want an *OptionError", err)
			}
			if oe.Flag != tt.wantFlag {
				t.Fatalf("error names --%s, want --%s (%v)", oe.Flag, tt.wantFlag, err)
			}
			if tt.conn.Password != "" && strings.Contains(err.Error(), tt.conn.Password) {
				t.Fatalf("error %q shows the password", err)
			}
		})
	}
}

func TestPublishLagMetric(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	reader := sdkmetric.NewManualReader()
	m, err := telemetry.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, srv.URL(), newMemStore(), func(c *events.Config) { c.Metrics = m })
	p.Durable("", "m", mkEvents(0, 7))
	flush(t, p)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name != telemetry.MetricPublishLag {
				continue
			}
			h := md.Data.(metricdata.Histogram[float64])
			if len(h.DataPoints) != 1 || h.DataPoints[0].Count != 7 {
				t.Fatalf("publish lag data points = %+v, want one with count 7", h.DataPoints)
			}
			return
		}
	}
	t.Fatalf("%s not recorded", telemetry.MetricPublishLag)
}

func TestCloseWithNATSDownDoesNotWaitForTheDeadline(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.Stop()
	p, err := events.New(t.Context(), events.Config{Conn: events.Conn{URL: srv.URL()}, Store: newMemStore(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p.Durable("", "c", mkEvents(0, 3))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	err = p.Close(ctx)
	if err == nil {
		t.Fatal("Close reported success with 3 events unpublished")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("Close took %s with NATS down; it should give up after its grace", d)
	}
}

// TestWidensAStreamOfTheOldSubjects: a stream created when subjects had no
// tenant (dsh.events.*) is widened to dsh.events.> and the events land on
// the tenant subjects.
func TestWidensAStreamOfTheOldSubjects(t *testing.T) {
	t.Parallel()
	srv, nc := startWithClient(t)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{"dsh.events.*"}}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, srv.URL(), newMemStore(), nil)
	p.Durable("acme", "w", mkEvents(0, 3))
	flush(t, p)
	st, err := js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Subjects; fmt.Sprint(got) != "["+events.AllEvents+"]" {
		t.Fatalf("stream subjects %v, want [%s]", got, events.AllEvents)
	}
	msgs := readStream(t, srv.URL())
	checkExactlyOnce(t, msgs, "w", 3)
	if msgs[0].subject != "dsh.events.acme.w" {
		t.Fatalf("published on %s", msgs[0].subject)
	}
}

// TestWidensAndLimitsAnOldStream: an old-subjects stream met by a publisher
// with limits gets both the wider subjects and the limits (applying the
// limits from the config read before the widening narrowed it again).
func TestWidensAndLimitsAnOldStream(t *testing.T) {
	t.Parallel()
	srv, nc := startWithClient(t)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{"dsh.events.*"}}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, srv.URL(), newMemStore(), func(c *events.Config) {
		c.Limits = events.StreamLimits{MaxAge: time.Hour, MaxBytes: 1 << 20}
	})
	p.Durable("acme", "w", mkEvents(0, 3))
	flush(t, p)
	c := streamConfig(t, srv.URL())
	if fmt.Sprint(c.Subjects) != "["+events.AllEvents+"]" || c.MaxAge != time.Hour || c.MaxBytes != 1<<20 || c.Discard != jetstream.DiscardOld {
		t.Fatalf("stream subjects %v, max age %v, max bytes %d, discard %v; want [%s], 1h, 1 MiB, old", c.Subjects, c.MaxAge, c.MaxBytes, c.Discard, events.AllEvents)
	}
	checkExactlyOnce(t, readStream(t, srv.URL()), "w", 3)
}

// TestOversizeEventDoesNotStall: an event over the server's max_payload (1 MB
// by default) is published as a reference message in its place, and the
// events after it still flow; before, the session's fan-out stopped for good.
func TestOversizeEventDoesNotStall(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t) // default limits: max_payload 1 MB
	store := newMemStore()
	// An acknowledgement that never comes would stall the window for
	// AckTimeout; a minute makes that outlast flush's deadline.
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.AckTimeout = time.Minute })
	evs := mkEvents(0, 5)
	big := strings.Repeat("x", 3<<20)
	evs[1] = &sessionv1.SessionEvent{Seq: 1, Time: 1001, SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Append{Append: &sessionv1.SurfaceAppend{}}},
		Payload: &sessionv1.SessionEvent_ContextMessage{ContextMessage: &sessionv1.ContextMessage{Content: []*llmv1.ContentBlock{
			{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: big}}}}}}}
	p.Durable("acme", "big", evs)
	flush(t, p)
	if got := store.cursor("big"); got != 5 {
		t.Fatalf("cursor = %d, want 5 (publishing stalled at the big event)", got)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		id, ev, err := events.DecodeEvent(m.Header, m.Data)
		var om *events.OmittedError
		switch {
		case seq == 2:
			if !errors.As(err, &om) || om.Seq != 1 || om.Size < 3<<20 || id != "big" || om.Type != "context/message" {
				t.Fatalf("message 2: got %v %v, want an OmittedError for seq 1", ev, err)
			}
			if !strings.Contains(err.Error(), "StreamEvents from_seq=1") {
				t.Fatalf("the error does not say how to fetch the event: %v", err)
			}
		case err != nil:
			t.Fatalf("message %d: %v", seq, err)
		case ev.GetSeq() != int64(seq-1):
			t.Fatalf("message %d holds seq %d", seq, ev.GetSeq())
		}
	}
}

// batchStore is a memStore that also writes cursors in batches
// (events.CursorBatch), counting the calls of each kind; refuse names a
// session whose cursor it refuses to write.
type batchStore struct {
	*memStore
	batches, singles atomic.Int32
	largest, last    atomic.Int32 // sessions in the largest and the last batch call
	refuse           atomic.Pointer[string]
}

func (b *batchStore) SetPublishedCursor(ctx context.Context, id string, next int64) error {
	b.singles.Add(1)
	return b.memStore.SetPublishedCursor(ctx, id, next)
}

func (b *batchStore) SetPublishedCursors(ctx context.Context, ids []string, next []int64) []error {
	b.batches.Add(1)
	b.last.Store(int32(len(ids)))
	if n := int32(len(ids)); n > b.largest.Load() {
		b.largest.Store(n)
	}
	errs := make([]error, len(ids))
	for i, id := range ids {
		if r := b.refuse.Load(); r != nil && *r == id {
			errs[i] = fmt.Errorf("session %q: refused", id)
			continue
		}
		errs[i] = b.memStore.SetPublishedCursor(ctx, id, next[i])
	}
	return errs
}

// TestCursorsSavedInOneCall: with a store that writes cursors in batches,
// the moved cursors of many sessions are saved in one call, none one by
// one; a cursor the store refused is not taken as saved and is written by
// a later save; a cursor never passes what JetStream acknowledged.
func TestCursorsSavedInOneCall(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	store := &batchStore{memStore: newMemStore()}
	refused := "s-3"
	store.refuse.Store(&refused)
	// Cursors are saved only by Flush here (the ticker never fires).
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.CursorEvery = time.Hour })
	ids := []string{"s-1", "s-2", "s-3", "s-4"}
	for _, id := range ids {
		p.Durable("", id, mkEvents(0, 6))
	}
	flush(t, p)
	if n := store.singles.Load(); n != 0 {
		t.Errorf("%d cursors saved one by one, want 0", n)
	}
	if b, l := store.batches.Load(), store.largest.Load(); b < 1 || l != 4 {
		t.Errorf("%d batch calls, the largest of %d sessions; want one holding all 4", b, l)
	}
	for _, id := range ids {
		want := int64(6)
		if id == refused {
			want = 0
		}
		if got := store.cursor(id); got != want {
			t.Errorf("cursor of %s = %d, want %d", id, got, want)
		}
	}
	// The refused cursor is written by the next save, with only it moved.
	store.refuse.Store(nil)
	before := store.batches.Load()
	flush(t, p)
	if got := store.cursor(refused); got != 6 {
		t.Fatalf("cursor of %s after the store took it again = %d, want 6", refused, got)
	}
	if store.batches.Load() != before+1 || store.last.Load() != 1 {
		t.Errorf("the retry took %d calls, the last of %d sessions; want 1 of only the refused one", store.batches.Load()-before, store.last.Load())
	}
	msgs := readStream(t, srv.URL())
	for _, id := range ids {
		checkExactlyOnce(t, msgs, id, 6)
	}
}

// threePerSubject starts a server with the event stream made to take
// three events per subject and refuse the rest; it returns a client
// connection, its JetStream and the stream's config, to update it with.
func threePerSubject(t *testing.T) (*natstest.Server, *nats.Conn, jetstream.JetStream, jetstream.StreamConfig) {
	t.Helper()
	srv, nc := startWithClient(t)
	js, _ := jetstream.New(nc)
	cfg := jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{events.AllEvents},
		MaxMsgsPerSubject: 3, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true}
	if _, err := js.CreateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	return srv, nc, js, cfg
}

// TestRefusedPublishesWaitAlone: JetStream refusing one session's events
// (its subject is full) holds back that session alone: the cursor stops at
// the first refused event, its status waits, and the other sessions of the
// same pipeline are published, their statuses after their events. Once
// the stream takes the events again they are published from the cursor,
// exactly once and in order, and the held status follows them.
func TestRefusedPublishesWaitAlone(t *testing.T) {
	t.Parallel()
	srv, nc, js, cfg := threePerSubject(t)
	sub, err := nc.SubscribeSync(events.AllStatus)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.BatchSize = 4 })
	p.Durable("", "full", mkEvents(0, 6))
	p.Status("", "full", agentv1.AgentStatus_AGENT_STATUS_IDLE)
	for _, id := range []string{"b", "c"} {
		p.Durable("", id, mkEvents(0, 3))
		p.Status("", id, agentv1.AgentStatus_AGENT_STATUS_IDLE)
	}
	next := func() string {
		t.Helper()
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		id, _, err := events.DecodeStatus(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	got := []string{next(), next()}
	slices.Sort(got)
	if fmt.Sprint(got) != "[b c]" {
		t.Fatalf("statuses of %v first, want b and c (the refused session's waits)", got)
	}
	// The sessions are published in any order within a round, and an
	// acknowledged event counts in Pending until its cursor is saved (one
	// save for several sessions): wait until the three refused events are
	// all that is left, then every accepted event must be in the stream.
	for deadline := time.Now().Add(10 * time.Second); p.Pending() != 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := p.Pending(); n != 3 {
		t.Fatalf("Pending = %d, want the 3 refused events", n)
	}
	msgs := readStream(t, srv.URL())
	checkExactlyOnce(t, msgs, "b", 3)
	checkExactlyOnce(t, msgs, "c", 3)
	checkExactlyOnce(t, msgs, "full", 3)
	cfg.MaxMsgsPerSubject = 100
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	if id := next(); id != "full" {
		t.Fatalf("status of %s, want full's", id)
	}
	checkExactlyOnce(t, readStream(t, srv.URL()), "full", 6)
	flush(t, p)
	if c := store.cursor("full"); c != 6 {
		t.Fatalf("cursor of full = %d, want 6", c)
	}
}

// TestOutageMidPipeline: the server goes away while many sessions' events
// wait for their acknowledgements in the window; whatever was in flight,
// once it is back every session ends up in the stream exactly once, in
// order, and every cursor at the end.
func TestOutageMidPipeline(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	store := newMemStore()
	// AckTimeout outlasts flush: only the lost connection can end the wait
	// for the replies owed before the outage.
	p := newPublisher(t, srv.URL(), store, func(c *events.Config) { c.BatchSize = 64; c.AckTimeout = time.Minute })
	const sessions, perSession = 20, 60
	id := func(i int) string { return "mid-" + strconv.Itoa(i) }
	for i := range sessions {
		p.Durable("", id(i), mkEvents(0, 1)) // every session's tail read before the outage
	}
	flush(t, p)
	for i := range sessions {
		p.Durable("", id(i), mkEvents(1, perSession))
	}
	srv.Stop()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	flush(t, p)
	msgs := readStream(t, srv.URL())
	for i := range sessions {
		checkExactlyOnce(t, msgs, id(i), perSession)
		if c := store.cursor(id(i)); c != perSession {
			t.Fatalf("cursor of %s = %d, want %d", id(i), c, perSession)
		}
	}
}
