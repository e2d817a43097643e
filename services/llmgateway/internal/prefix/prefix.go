// Package prefix remembers the conversations of recent model requests, so
// that the next request of a conversation can name the earlier one and
// carry only the messages appended since (GenerateRequest.prefix): the
// gateway then decodes, validates and encodes only what is new instead of
// the whole conversation on every step.
//
// A remembered conversation is an Entry: the decoded messages, system
// prompt and tools (immutable once remembered) and, beside them, one
// adapter's encoding of the messages' part of the body. Its id is a
// SHA-256 over a chain of SHA-256 hashes of the messages' protobuf
// encodings seeded with the tenant, a hash of the system prompt and one of
// the tools; entries are keyed by tenant and id: an id made under one
// tenant never resolves under another, and knowing an id is not enough to
// use it from another tenant.
//
// The cache is bounded by bytes (the messages' wire size plus the bodies
// kept beside them), overall and per tenant, evicting the least recently
// used entries first, and by time: an entry unused for DefaultTTL is
// forgotten (the decoded messages are pointer-dense heap that every
// garbage collection marks: stale ones cost CPU, not only memory). When a request continues an entry, its successor
// replaces it (a conversation holds one entry, not one per step). A miss is
// never an error of the conversation: the caller sends the whole request
// again (docs/API.md).
package prefix

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// Entry is one remembered conversation: the messages, the system prompt
// and the tools of a request. They must not be modified.
type Entry struct {
	tenant   string
	hash     [sha256.Size]byte
	Messages []*llmv1.Message
	System   *string
	Tools    []*llmv1.ToolSchema
	// chain is the hash of the messages alone, sys and tools those of the
	// system prompt and the tools; hash (the id) is over the three.
	chain, sys, tools [sha256.Size]byte
	// msgBytes is the wire size of the messages, toolBytes of the tools
	// (the system prompt's is its length); body is the adapter body kept
	// beside them (guarded by the cache's lock).
	msgBytes, toolBytes int64
	body                *provider.BodyPrefix
	global              *list.Element
	local               *list.Element
	gone                bool
	// used is when the entry was last made or resolved.
	used time.Time
}

// ID is the entry's id for GenerateRequest.prefix.id (lowercase hex).
func (e *Entry) ID() string { return hex.EncodeToString(e.hash[:]) }

// MessageBytes is the wire size of the entry's messages.
func (e *Entry) MessageBytes() int64 { return e.msgBytes }

// ToolBytes is the wire size of the entry's tools.
func (e *Entry) ToolBytes() int64 { return e.toolBytes }

func (e *Entry) size() int64 {
	n := e.msgBytes + e.toolBytes
	if e.System != nil {
		n += int64(len(*e.System))
	}
	if e.body != nil {
		n += int64(e.body.HeldBytes())
	}
	return n
}

type key struct {
	tenant string
	hash   [sha256.Size]byte
}

type tenantUse struct {
	size int64
	lru  list.List // of *Entry, front = most recent
}

// Cache is the bounded store of entries. It is safe for concurrent use.
type Cache struct {
	max, tenantMax int64
	ttl            time.Duration
	now            func() time.Time

	mu      sync.Mutex
	size    int64
	entries map[key]*Entry
	lru     list.List // of *Entry, front = most recent
	tenants map[string]*tenantUse
	stats   Stats

	// scratch recycles the buffers Put encodes messages and tools into to
	// hash them (*[]byte; none kept past maxScratch).
	scratch sync.Pool
}

// maxScratch is the largest encoding buffer Put keeps for the next one:
// a conversation with a huge message should not pin its size.
const maxScratch = 64 << 10

// Stats counts the cache's answers since it was made.
type Stats struct {
	Hits, Misses, Evictions int64
}

// DefaultTTL is how long an entry nobody used is kept: a session that
// idles this long is unloaded by the agent anyway, and what the gateway
// keeps is pointer-dense heap that every garbage collection marks.
const DefaultTTL = 10 * time.Minute

// New returns a cache of at most max bytes overall and tenantMax bytes
// per tenant (max when tenantMax <= 0 or larger), forgetting entries
// unused for DefaultTTL.
func New(max, tenantMax int64) *Cache {
	if tenantMax <= 0 || tenantMax > max {
		tenantMax = max
	}
	return &Cache{max: max, tenantMax: tenantMax, ttl: DefaultTTL, now: time.Now, entries: map[key]*Entry{}, tenants: map[string]*tenantUse{}}
}

// expire drops the entries unused for the TTL (the least recently used
// first, so it stops at the first one still fresh).
func (c *Cache) expire(now time.Time) {
	for c.lru.Len() > 0 {
		old := c.lru.Back().Value.(*Entry)
		if now.Sub(old.used) < c.ttl {
			return
		}
		c.remove(old)
		c.stats.Evictions++
	}
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Len is the number of entries held.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Get returns tenant's entry with id holding count messages; false when
// there is none (never made, evicted, another tenant's, a malformed id or
// a count that does not match).
func (c *Cache) Get(tenant, id string, count int) (*Entry, bool) {
	var h [sha256.Size]byte
	if len(id) != 2*len(h) {
		c.miss()
		return nil, false
	}
	if _, err := hex.Decode(h[:], []byte(id)); err != nil {
		c.miss()
		return nil, false
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	e := c.entries[key{tenant, h}]
	if e == nil || len(e.Messages) != count {
		c.stats.Misses++
		return nil, false
	}
	c.stats.Hits++
	e.used = now
	c.lru.MoveToFront(e.global)
	c.tenants[tenant].lru.MoveToFront(e.local)
	return e, true
}

func (c *Cache) miss() {
	c.mu.Lock()
	c.stats.Misses++
	c.mu.Unlock()
}

// chain is the hash of the messages up to one whose encoding is b, given
// h, the hash of those before it.
func chain(h [sha256.Size]byte, b []byte) [sha256.Size]byte {
	d := sha256.New()
	d.Write(h[:])
	d.Write(b)
	var out [sha256.Size]byte
	d.Sum(out[:0])
	return out
}

// seed is the hash before any message: tenant-specific, so that the same
// conversation has different ids under different tenants.
func seed(tenant string) [sha256.Size]byte {
	return sha256.Sum256([]byte("dsh.llm.v1 prefix\x00" + tenant))
}

// Request is what Put remembers: a request's whole conversation and
// what in it is new since the entry it continues.
type Request struct {
	// Messages is the whole conversation (the continued entry's messages,
	// then Added); kept as it is.
	Messages []*llmv1.Message
	// Added is what is new: all of Messages when nothing is continued.
	Added  []*llmv1.Message
	System *string
	Tools  []*llmv1.ToolSchema
	// SameSystem and SameTools say that System and Tools are the
	// continued entry's (their hashes are not computed again).
	SameSystem, SameTools bool
}

// Put remembers r under tenant, continuing prev (nil: r.Added is the whole
// conversation), which it replaces, and returns the new entry. An entry
// larger than the tenant's bound is not remembered (nil). The encodings it
// hashes go through a recycled buffer (Cache.scratch), and the tenant's
// seed is hashed only for a conversation that continues nothing.
func (c *Cache) Put(tenant string, prev *Entry, r Request) (*Entry, error) {
	e := &Entry{tenant: tenant, Messages: r.Messages, System: r.System, Tools: r.Tools}
	if prev != nil {
		e.chain, e.msgBytes = prev.chain, prev.msgBytes
	} else {
		e.chain = seed(tenant)
	}
	bp, _ := c.scratch.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	buf := *bp
	opts := proto.MarshalOptions{Deterministic: true}
	for _, m := range r.Added {
		var err error
		if buf, err = opts.MarshalAppend(buf[:0], m); err != nil {
			return nil, err
		}
		e.chain = chain(e.chain, buf)
		e.msgBytes += int64(len(buf))
	}
	if prev != nil && r.SameSystem {
		e.sys = prev.sys
	} else {
		d := sha256.New()
		if r.System != nil {
			d.Write([]byte{1})
			d.Write([]byte(*r.System))
		}
		d.Sum(e.sys[:0])
	}
	if prev != nil && r.SameTools {
		e.tools, e.toolBytes = prev.tools, prev.toolBytes
	} else {
		d := sha256.New()
		for _, t := range r.Tools {
			var err error
			if buf, err = opts.MarshalAppend(buf[:0], t); err != nil {
				return nil, err
			}
			var n [binary.MaxVarintLen64]byte
			d.Write(n[:binary.PutUvarint(n[:], uint64(len(buf)))])
			d.Write(buf)
			e.toolBytes += int64(len(buf))
		}
		d.Sum(e.tools[:0])
	}
	if cap(buf) <= maxScratch { // an error above drops the buffer: rare, and the pool makes another
		*bp = buf[:0]
		c.scratch.Put(bp)
	}
	d := sha256.New()
	d.Write(e.chain[:])
	d.Write(e.sys[:])
	d.Write(e.tools[:])
	d.Sum(e.hash[:0])
	h := e.hash
	now := c.now()
	e.used = now
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	if prev != nil && !prev.gone && prev.hash != h {
		c.remove(prev)
	}
	if e.size() > c.tenantMax {
		return nil, nil
	}
	if old := c.entries[key{tenant, h}]; old != nil {
		// The same request again (a retried step): keep the old entry
		// and its body.
		old.used = now
		c.lru.MoveToFront(old.global)
		c.tenants[tenant].lru.MoveToFront(old.local)
		return old, nil
	}
	t := c.tenants[tenant]
	if t == nil {
		t = &tenantUse{}
		c.tenants[tenant] = t
	}
	c.entries[key{tenant, h}] = e
	e.global = c.lru.PushFront(e)
	e.local = t.lru.PushFront(e)
	c.add(e, e.size())
	return e, nil
}

// SetBody keeps b beside e (replacing any body it had), within the bounds.
func (c *Cache) SetBody(e *Entry, b *provider.BodyPrefix) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.gone {
		return
	}
	before := e.size()
	e.body = b
	if e.size() > c.tenantMax {
		// Too big: e keeps no body (the one it replaced is gone too, and
		// no longer counted).
		e.body = nil
	}
	c.add(e, e.size()-before)
}

// Body returns the body kept beside e, or nil.
func (c *Cache) Body(e *Entry) *provider.BodyPrefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.body
}

// add accounts delta more bytes to e (held) and evicts down to the
// bounds, never e itself.
func (c *Cache) add(e *Entry, delta int64) {
	t := c.tenants[e.tenant]
	c.size += delta
	t.size += delta
	c.evict(e, &t.lru, func() bool { return t.size > c.tenantMax })
	c.evict(e, &c.lru, func() bool { return c.size > c.max })
}

// evict removes the least recently used entries of lru but e while over
// reports true (e may be the least recently used: a body set on an older
// entry; eviction goes on past it).
func (c *Cache) evict(e *Entry, lru *list.List, over func() bool) {
	for over() {
		el := lru.Back()
		if el != nil && el.Value.(*Entry) == e {
			el = el.Prev()
		}
		if el == nil {
			return
		}
		c.remove(el.Value.(*Entry))
		c.stats.Evictions++
	}
}

func (c *Cache) remove(e *Entry) {
	t := c.tenants[e.tenant]
	sz := e.size()
	c.size -= sz
	t.size -= sz
	c.lru.Remove(e.global)
	t.lru.Remove(e.local)
	delete(c.entries, key{e.tenant, e.hash})
	e.gone = true
	if t.lru.Len() == 0 {
		delete(c.tenants, e.tenant)
	}
}
