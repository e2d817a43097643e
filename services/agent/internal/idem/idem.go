// Package idem is the bounded in-memory reply cache in front of the agent's
// durable idempotency records: a retried command whose key it holds gets the
// first call's reply without touching the session. The authority is the
// session log (every admitted command's request_id is recorded there); the
// cache only spares a retry the trip to the session and keeps the first
// reply byte-for-byte.
package idem

import (
	"container/list"
	"sync"
)

// Key scopes a request id: the tenant, the method and the session (empty for
// CreateSession) it was sent with.
type Key struct {
	Tenant, Method, Session, RequestID string
}

// Cache is a least-recently-used map from keys to replies, safe for
// concurrent use. The zero value is not usable; call New.
type Cache[V any] struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *entry[V], most recent first
	byKey map[Key]*list.Element
}

type entry[V any] struct {
	key Key
	val V
}

// New returns a cache holding at most max replies (at least 1).
func New[V any](max int) *Cache[V] {
	if max < 1 {
		max = 1
	}
	return &Cache[V]{max: max, order: list.New(), byKey: make(map[Key]*list.Element)}
}

// Get returns the reply stored under k.
func (c *Cache[V]) Get(k Key) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*entry[V]).val, true
}

// Put stores the reply of k unless one is stored already (the first reply
// wins), evicting the least recently used entry beyond the bound.
func (c *Cache[V]) Put(k Key, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[k]; ok {
		return
	}
	c.byKey[k] = c.order.PushFront(&entry[V]{key: k, val: v})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(*entry[V]).key)
	}
}

// Len is the number of stored replies.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
