package prefix

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

func msg(s string) *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}}}
}

func msgs(prefix string, n, size int) []*llmv1.Message {
	var out []*llmv1.Message
	for i := range n {
		out = append(out, msg(fmt.Sprintf("%s %d %s", prefix, i, strings.Repeat("x", size))))
	}
	return out
}

func put(t *testing.T, c *Cache, tenant string, prev *Entry, all []*llmv1.Message) *Entry {
	t.Helper()
	added := all
	if prev != nil {
		added = all[len(prev.Messages):]
	}
	e, err := c.Put(tenant, prev, Request{Messages: all, Added: added})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestChainAndTenants(t *testing.T) {
	t.Parallel()
	c := New(1<<20, 0)
	conv := msgs("m", 5, 10)
	whole := put(t, c, "a", nil, conv)
	// The same conversation built step by step has the same id: the id
	// is the chain over the messages, not over the requests.
	c2 := New(1<<20, 0)
	e := put(t, c2, "a", nil, conv[:2])
	e = put(t, c2, "a", e, conv[:4])
	e = put(t, c2, "a", e, conv)
	if e.ID() != whole.ID() {
		t.Fatalf("step by step %s, whole %s", e.ID(), whole.ID())
	}
	if c2.Len() != 1 {
		t.Errorf("a continued entry stayed: %d entries", c2.Len())
	}
	// Another tenant, the same messages: another id, and neither resolves
	// under the other.
	b := put(t, c, "b", nil, conv)
	if b.ID() == whole.ID() {
		t.Fatal("two tenants share an id")
	}
	for _, tc := range []struct {
		tenant, id string
		count      int
		ok         bool
	}{
		{"a", whole.ID(), 5, true},
		{"b", b.ID(), 5, true},
		{"b", whole.ID(), 5, false},
		{"a", b.ID(), 5, false},
		{"", whole.ID(), 5, false},
		{"a", whole.ID(), 4, false},
		{"a", whole.ID()[:63], 5, false},
		{"a", whole.ID() + "0", 5, false},
		{"a", "", 0, false},
	} {
		if _, ok := c.Get(tc.tenant, tc.id, tc.count); ok != tc.ok {
			t.Errorf("Get(%q, %q, %d) = %v, want %v", tc.tenant, tc.id, tc.count, ok, tc.ok)
		}
	}
	// The system prompt and the tools are part of the id, inherited or
	// not.
	sys, other := "be terse", "be verbose"
	tools := []*llmv1.ToolSchema{{Name: "read"}}
	c3 := New(1<<20, 0)
	withHead, err := c3.Put("a", nil, Request{Messages: conv[:2], Added: conv[:2], System: &sys, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{whole.ID(): true}
	for _, r := range []Request{
		{System: &sys, Tools: tools, SameSystem: true, SameTools: true},
		{System: &other, Tools: tools, SameTools: true},
		{System: &sys},
		{System: nil, Tools: tools, SameTools: true},
	} {
		r.Messages, r.Added = conv, conv[2:]
		e, err := c3.Put("a", withHead, r)
		if err != nil {
			t.Fatal(err)
		}
		if ids[e.ID()] {
			t.Errorf("head %+v: an id seen before", r)
		}
		ids[e.ID()] = true
		// The same request sent whole has the same id.
		whole, err := New(1<<20, 0).Put("a", nil, Request{Messages: conv, Added: conv, System: r.System, Tools: r.Tools})
		if err != nil {
			t.Fatal(err)
		}
		if whole.ID() != e.ID() {
			t.Errorf("head %+v: continued id %s, whole %s", r, e.ID(), whole.ID())
		}
	}
	// A change anywhere changes the id.
	changed := append(append([]*llmv1.Message(nil), conv[:2]...), msg("other"))
	changed = append(changed, conv[3:]...)
	if put(t, New(1<<20, 0), "a", nil, changed).ID() == whole.ID() {
		t.Error("a changed message kept the id")
	}
}

func TestEviction(t *testing.T) {
	t.Parallel()
	size := int64(proto.Size(msgs("t", 1, 100)[0]))
	// Room for 4 such messages overall, 2 per tenant.
	c := New(4*size+size/2, 2*size+size/2)
	a1 := put(t, c, "a", nil, msgs("a1", 1, 100))
	a2 := put(t, c, "a", nil, msgs("a2", 1, 100))
	b1 := put(t, c, "b", nil, msgs("b1", 1, 100))
	if _, ok := c.Get("a", a1.ID(), 1); !ok { // a1 is now more recent than a2
		t.Fatal("a1 evicted early")
	}
	a3 := put(t, c, "a", nil, msgs("a3", 1, 100)) // over a's share: a2 (a's oldest) goes
	for _, tc := range []struct {
		tenant string
		e      *Entry
		ok     bool
	}{{"a", a1, true}, {"a", a2, false}, {"a", a3, true}, {"b", b1, true}} {
		if _, ok := c.Get(tc.tenant, tc.e.ID(), 1); ok != tc.ok {
			t.Errorf("%s %s held = %v, want %v", tc.tenant, tc.e.Messages[0].GetContent()[0].GetText().GetText()[:2], ok, tc.ok)
		}
	}
	// Tenant b fills the rest: the overall bound evicts the least recent
	// entry of anyone.
	b2 := put(t, c, "b", nil, msgs("b2", 1, 100))
	put(t, c, "c", nil, msgs("c1", 1, 100))
	held := 0
	for _, e := range []*Entry{a1, a3, b1, b2} {
		if _, ok := c.Get(e.tenant, e.ID(), 1); ok {
			held++
		}
	}
	if held != 3 || c.Len() != 4 {
		t.Errorf("held %d of the older 4, %d entries; want 3 and 4", held, c.Len())
	}
	if c.Stats().Evictions != 2 {
		t.Errorf("evictions = %d, want 2", c.Stats().Evictions)
	}
	// An entry larger than a tenant's share is not kept, and a body that
	// would make it so is dropped.
	if e := put(t, c, "a", nil, msgs("huge", 1, 1000)); e != nil {
		t.Error("an entry over the tenant's bound was kept")
	}
	c.SetBody(a3, &provider.BodyPrefix{N: 1, Segments: [][]byte{make([]byte, 10*size)}})
	if c.Body(a3) != nil {
		t.Error("a body over the tenant's bound was kept")
	}
	c.SetBody(a3, &provider.BodyPrefix{N: 1, Segments: [][]byte{[]byte("[]")}})
	if b := c.Body(a3); b == nil || string(bytes.Join(b.Segments, nil)) != "[]" {
		t.Error("a small body was not kept")
	}
	if c.size < 0 || c.size > c.max {
		t.Errorf("accounted size %d outside [0, %d]", c.size, c.max)
	}
}

// FuzzGet: no id, tenant or count resolves anything but the entry made
// under that very tenant with that id and count.
func FuzzGet(f *testing.F) {
	c := New(1<<20, 0)
	conv := msgs("m", 3, 10)
	e, err := c.Put("victim", nil, Request{Messages: conv, Added: conv})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("victim", e.ID(), 3)
	f.Add("attacker", e.ID(), 3)
	f.Add("victim", strings.ToUpper(e.ID()), 3)
	f.Add("victim", e.ID()[:63]+"g", 3)
	f.Add("", "", 0)
	f.Fuzz(func(t *testing.T, tenant, id string, count int) {
		got, ok := c.Get(tenant, id, count)
		if !ok {
			return
		}
		if got != e || tenant != "victim" || count != 3 || !strings.EqualFold(id, e.ID()) {
			t.Fatalf("Get(%q, %q, %d) resolved", tenant, id, count)
		}
	})
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	c := New(1<<20, 0)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	old := put(t, c, "a", nil, msgs("old", 1, 10))
	now = now.Add(DefaultTTL / 2)
	fresh := put(t, c, "a", nil, msgs("fresh", 1, 10))
	now = now.Add(DefaultTTL/2 + time.Second)
	if _, ok := c.Get("a", old.ID(), 1); ok {
		t.Error("an entry unused for the TTL resolved")
	}
	if _, ok := c.Get("a", fresh.ID(), 1); !ok {
		t.Error("a fresh entry expired")
	}
	now = now.Add(DefaultTTL - time.Second) // fresh was used just now: kept
	if _, ok := c.Get("a", fresh.ID(), 1); !ok {
		t.Error("an entry in use expired")
	}
	if c.Len() != 1 || c.size != fresh.size() {
		t.Errorf("%d entries of %d bytes; want 1 of %d", c.Len(), c.size, fresh.size())
	}
}

// TestSetBodyTooBigUncountsOld: a body replaced by one over the tenant's
// bound is dropped, and the bytes of the one it replaced are no longer
// counted: removing the entry brings the cache back to zero.
func TestSetBodyTooBigUncountsOld(t *testing.T) {
	t.Parallel()
	c := New(1<<20, 1000)
	e := put(t, c, "a", nil, msgs("a", 1, 10))
	c.SetBody(e, &provider.BodyPrefix{N: 1, Segments: [][]byte{make([]byte, 500)}})
	if c.Body(e) == nil {
		t.Fatal("a body within the bound was not kept")
	}
	c.SetBody(e, &provider.BodyPrefix{N: 1, Segments: [][]byte{make([]byte, 5000)}})
	if c.Body(e) != nil {
		t.Fatal("a body over the tenant's bound was kept")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.size != e.size() || c.tenants["a"].size != e.size() {
		t.Errorf("accounted %d (tenant %d), the entry holds %d", c.size, c.tenants["a"].size, e.size())
	}
	c.remove(e)
	if c.size != 0 {
		t.Errorf("size after removing the only entry = %d, want 0 (the dropped body's predecessor stayed counted)", c.size)
	}
}

// TestSetBodyEvictsPastItself: a body that takes an entry over a bound
// evicts the other entries, older or newer, until the cache is within it,
// never the entry itself: it does not stop at the entry when that is the
// least recently used.
func TestSetBodyEvictsPastItself(t *testing.T) {
	t.Parallel()
	size := int64(proto.Size(msgs("t", 1, 100)[0]))
	for _, tc := range []struct {
		name           string
		max, tenantMax int64
		tenants        [2]string
	}{
		{"tenant bound", 100 * size, 3 * size, [2]string{"a", "a"}},
		{"overall bound", 3 * size, 0, [2]string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(tc.max, tc.tenantMax)
			old := put(t, c, tc.tenants[0], nil, msgs("old", 1, 100))
			newer := put(t, c, tc.tenants[1], nil, msgs("new", 1, 100))
			// old is the least recently used: its body takes the cache
			// over the bound, so newer has to go.
			c.SetBody(old, &provider.BodyPrefix{N: 1, Segments: [][]byte{make([]byte, size+size/2)}})
			if c.Body(old) == nil {
				t.Fatal("the body was dropped")
			}
			if _, ok := c.Get(tc.tenants[1], newer.ID(), 1); ok {
				t.Error("the other entry stayed: the cache is over its bound")
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.size > c.max || c.tenants[tc.tenants[0]].size > c.tenantMax {
				t.Errorf("size %d (tenant %d) over the bounds %d / %d", c.size, c.tenants[tc.tenants[0]].size, c.max, c.tenantMax)
			}
		})
	}
}

// TestBodyCountsHeldBuffer: a body that is a slice of a larger buffer is
// counted as the whole buffer it keeps alive, not its length.
func TestBodyCountsHeldBuffer(t *testing.T) {
	t.Parallel()
	c := New(1<<20, 1000)
	e := put(t, c, "a", nil, msgs("a", 1, 10))
	buf := make([]byte, 5000)
	c.SetBody(e, &provider.BodyPrefix{N: 1, Segments: [][]byte{buf[:10:10]}, Held: cap(buf)})
	if c.Body(e) != nil {
		t.Error("a 10-byte slice of a 5000-byte buffer was kept under a 1000-byte bound")
	}
	c.SetBody(e, &provider.BodyPrefix{N: 1, Segments: [][]byte{buf[:10:10]}, Held: 600})
	c.mu.Lock()
	defer c.mu.Unlock()
	if want := int64(proto.Size(e.Messages[0])) + 600; e.body == nil || c.size != want {
		t.Errorf("size %d, want %d (the held buffer counted)", c.size, want)
	}
}
