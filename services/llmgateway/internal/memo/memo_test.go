package memo

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

func TestMemo(t *testing.T) {
	t.Parallel()
	calls := map[string]int{}
	var mu sync.Mutex
	m := New(3, func(s string) (int, error) {
		mu.Lock()
		calls[s]++
		mu.Unlock()
		if s == "bad" {
			return 0, errors.New("bad input")
		}
		return len(s), nil
	})
	tests := []struct {
		in      string
		want    int
		wantErr bool
		calls   int // f's calls for in after this Get
		held    int
	}{
		{"a", 1, false, 1, 1},
		{"a", 1, false, 1, 1},    // remembered
		{"bad", 0, true, 1, 1},   // a failure is not remembered
		{"bad", 0, true, 2, 1},   // so it is computed again
		{"bb", 2, false, 1, 2},   //
		{"ccc", 3, false, 1, 3},  // full
		{"dddd", 4, false, 1, 1}, // past the bound: everything forgotten first
		{"a", 1, false, 2, 2},    // computed again
		{"dddd", 4, false, 1, 2}, // still remembered
	}
	for i, tt := range tests {
		got, err := m.Get(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Fatalf("%d: Get(%q) = %d, %v; want %d, error %v", i, tt.in, got, err, tt.want, tt.wantErr)
		}
		if calls[tt.in] != tt.calls || m.Len() != tt.held {
			t.Fatalf("%d: after Get(%q): f called %d times, %d held; want %d, %d", i, tt.in, calls[tt.in], m.Len(), tt.calls, tt.held)
		}
	}
}

func TestMemoConcurrent(t *testing.T) {
	t.Parallel()
	m := New(8, func(s string) (string, error) { return "<" + s + ">", nil })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := fmt.Sprint((g + i) % 12)
				if v, err := m.Get(k); err != nil || v != "<"+k+">" {
					t.Errorf("Get(%q) = %q, %v", k, v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := m.Len(); n > 8 {
		t.Fatalf("%d results held, bound 8", n)
	}
}
