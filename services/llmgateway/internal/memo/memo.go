// Package memo remembers the results of a pure function of a string, for
// the inputs that repeat on every request (a conversation's tool schemas:
// validated and encoded once, not on every model call). The memo is
// bounded: past its size it forgets everything and starts again, so input
// that never repeats costs one function call each and some churn, never
// unbounded memory. Failures are not remembered.
package memo

import (
	"strings"
	"sync"
)

// Memo remembers f's successful results. It is safe for concurrent use.
type Memo[V any] struct {
	f   func(string) (V, error)
	max int

	mu sync.RWMutex
	m  map[string]V
}

// New returns a memo of f holding at most max results.
func New[V any](max int, f func(string) (V, error)) *Memo[V] {
	return &Memo[V]{f: f, max: max, m: make(map[string]V)}
}

// Get returns f(k), from memory when f succeeded on k before.
func (m *Memo[V]) Get(k string) (V, error) {
	m.mu.RLock()
	v, ok := m.m[k]
	m.mu.RUnlock()
	if ok {
		return v, nil
	}
	v, err := m.f(k)
	if err != nil {
		return v, err
	}
	m.mu.Lock()
	if len(m.m) >= m.max {
		clear(m.m)
	}
	// The key is copied: k may share memory with a request that is gone
	// long before the memo forgets it.
	m.m[strings.Clone(k)] = v
	m.mu.Unlock()
	return v, nil
}

// Len is the number of results held.
func (m *Memo[V]) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.m)
}
