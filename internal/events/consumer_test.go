package events_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/session"
)

const repoRoot = "../.."

// jetStream connects a plain client to url for the test's duration.
func jetStream(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// eventStream is DSH_EVENTS on url.
func eventStream(t *testing.T, url string) jetstream.Stream {
	t.Helper()
	st, err := jetStream(t, url).Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// turnEvents is one turn of a session: start, n chunks, the message, end.
func turnEvents(n int) []*sessionv1.SessionEvent {
	evs := []*sessionv1.SessionEvent{{Payload: &sessionv1.SessionEvent_TurnStart{TurnStart: &sessionv1.TurnStart{Turn: 1}}}}
	for i := range n {
		evs = append(evs, &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1,
			Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: strconv.Itoa(i)}}}}}})
	}
	evs = append(evs,
		&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantMessage{AssistantMessage: &sessionv1.AssistantMessage{Turn: 1}}},
		&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TurnEnd{TurnEnd: &sessionv1.TurnEnd{Turn: 1}}})
	for i, ev := range evs {
		ev.Seq, ev.Time = int64(i), 1_700_000_000_000+int64(i)
	}
	return evs
}

// The durable consumer of docs/events.md (max_ack_pending 1) gets a
// tenant's events in seq order per session; Dsh-Delta is on exactly the
// chunk events, so the consumer skips them by header without decoding.
func TestDurableConsumerInOrderSkippingDeltas(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	p := newPublisher(t, srv.URL(), newMemStore(), nil)
	const chunks = 20
	for _, id := range []string{"s1", "s.2"} {
		evs := turnEvents(chunks)
		p.Durable("acme", id, evs[:7])
		p.Durable("acme", id, evs[7:])
	}
	p.Durable("other", "s3", turnEvents(2)) // another tenant: not for this consumer
	flush(t, p)

	// The configuration docs/events.md gives.
	cons, err := jetStream(t, srv.URL()).CreateOrUpdateConsumer(t.Context(), events.StreamName, jetstream.ConsumerConfig{
		Durable: "billing", FilterSubject: events.TenantEvents("acme"), DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1, AckWait: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := 2 * (chunks + 3)
	next := map[string]int64{}
	var kept []string
	skipped := 0
	for got := 0; got < want; {
		batch, err := cons.Fetch(want, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			got++
			h := m.Headers()
			id := h.Get(events.HeaderSessionID)
			seq, err := strconv.ParseInt(h.Get(events.HeaderSeq), 10, 64)
			if err != nil || seq != next[id] {
				t.Fatalf("%s: seq %q, want %d (in order, no gaps)", id, h.Get(events.HeaderSeq), next[id])
			}
			next[id]++
			delta := h.Get(events.HeaderDelta) == "1"
			if delta != (h.Get(events.HeaderEventType) == session.TypeAssistantChunk) {
				t.Fatalf("%s seq %d: %s header %q on a %s", id, seq, events.HeaderDelta, h.Get(events.HeaderDelta), h.Get(events.HeaderEventType))
			}
			if delta {
				skipped++
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
				continue
			}
			_, ev, err := events.DecodeEvent(h, m.Data())
			if err != nil {
				t.Fatal(err)
			}
			kept = append(kept, id+" "+session.TypeName(ev))
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	if skipped != 2*chunks || len(kept) != 6 || next["s1"] != chunks+3 || next["s.2"] != chunks+3 {
		t.Fatalf("skipped %d, kept %v, next %v", skipped, kept, next)
	}
}

// The descriptor set of `make descriptors` (buf build -o) decodes a stored
// event dynamically, with no generated code.
func TestDescriptorSetDecodesEvents(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the descriptor set with buf")
	}
	out := filepath.Join(t.TempDir(), "dsh.binpb")
	cmd := exec.Command("go", "tool", "-modfile=tools/go.mod", "buf", "build", "-o", out)
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf build: %v\n%s", err, b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName("dsh.session.v1.SessionEvent")
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.MessageDescriptor)

	srv := natstest.Start(t)
	p := newPublisher(t, srv.URL(), newMemStore(), nil)
	p.Durable("", "s", turnEvents(1))
	flush(t, p)
	msg, err := eventStream(t, srv.URL()).GetLastMsgForSubject(t.Context(), events.EventSubject("", "s"))
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(msg.Data, dyn); err != nil {
		t.Fatal(err)
	}
	set1 := dyn.WhichOneof(md.Oneofs().ByName("payload"))
	if seq := dyn.Get(md.Fields().ByName("seq")).Int(); seq != 3 || set1 == nil || set1.Name() != "turn_end" || msg.Header.Get(events.HeaderEventType) != "turn/end" {
		t.Fatalf("dynamic decode: seq %d, payload %v, type header %q", seq, set1, msg.Header.Get(events.HeaderEventType))
	}
}

// docs/events.md's table of the three spellings matches the proto and
// session.TypeName, row for row.
func TestEventsDocTypeTable(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(repoRoot, "docs", "events.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string][]string{} // field name → cells
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(strings.Trim(sc.Text(), "| "), " | ")
		if len(cells) != 4 || !strings.HasPrefix(cells[1], "`") || !strings.Contains(cells[1], " / ") {
			continue
		}
		field := strings.Trim(strings.Split(cells[1], " / ")[0], "`")
		rows[field] = cells
	}
	md := (&sessionv1.SessionEvent{}).ProtoReflect().Descriptor()
	oo := md.Oneofs().ByName("payload")
	if len(rows) != oo.Fields().Len() {
		t.Errorf("docs/events.md has %d rows, the payload oneof %d fields", len(rows), oo.Fields().Len())
	}
	for i := range oo.Fields().Len() {
		fd := oo.Fields().Get(i)
		cells, ok := rows[string(fd.Name())]
		if !ok {
			t.Errorf("docs/events.md lacks a row for %s", fd.Name())
			continue
		}
		ev := &sessionv1.SessionEvent{}
		m := ev.ProtoReflect()
		m.Set(fd, protoreflect.ValueOfMessage(m.NewField(fd).Message()))
		wantType := session.TypeName(ev)
		if fd.Name() == "extension" {
			wantType = "*the extension's type*"
		} else if wantType != "" {
			wantType = "`" + wantType + "`"
		} else {
			wantType = cells[0] // a type session.TypeName does not name yet
		}
		want := []string{wantType, "`" + string(fd.Name()) + "` / `" + fd.JSONName() + "`", "`" + string(fd.Message().FullName()) + "`", strconv.Itoa(int(fd.Number()))}
		for j := range want {
			if cells[j] != want[j] {
				t.Errorf("docs/events.md row %s: cell %d is %s, want %s", fd.Name(), j, cells[j], want[j])
			}
		}
	}
}
