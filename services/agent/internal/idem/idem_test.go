package idem

import (
	"fmt"
	"testing"
)

func TestCache(t *testing.T) {
	k := func(i int) Key { return Key{Tenant: "t", Method: "Send", Session: "s", RequestID: fmt.Sprint(i)} }
	tests := []struct {
		name   string
		max    int
		puts   []int
		gets   []int // touched before the last put
		last   int
		want   []int
		absent []int
	}{
		{name: "bounded", max: 2, puts: []int{1, 2}, last: 3, want: []int{2, 3}, absent: []int{1}},
		{name: "get refreshes", max: 2, puts: []int{1, 2}, gets: []int{1}, last: 3, want: []int{1, 3}, absent: []int{2}},
		{name: "zero max holds one", max: 0, puts: []int{1}, last: 2, want: []int{2}, absent: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New[string](tt.max)
			for _, p := range tt.puts {
				c.Put(k(p), fmt.Sprint("v", p))
			}
			for _, g := range tt.gets {
				c.Get(k(g))
			}
			c.Put(k(tt.last), fmt.Sprint("v", tt.last))
			for _, w := range tt.want {
				if v, ok := c.Get(k(w)); !ok || v != fmt.Sprint("v", w) {
					t.Errorf("Get(%d) = %q, %v; want v%d", w, v, ok, w)
				}
			}
			for _, a := range tt.absent {
				if _, ok := c.Get(k(a)); ok {
					t.Errorf("Get(%d) found an evicted entry", a)
				}
			}
		})
	}
}

func TestFirstReplyWins(t *testing.T) {
	c := New[string](4)
	key := Key{Tenant: "t", Method: "Send", Session: "s", RequestID: "r"}
	c.Put(key, "first")
	c.Put(key, "second")
	if v, _ := c.Get(key); v != "first" {
		t.Fatalf("Get = %q, want the first reply", v)
	}
	other := key
	other.Tenant = "u"
	if _, ok := c.Get(other); ok {
		t.Fatal("another tenant's key found the reply")
	}
}
