package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// fakeAppender records batches; fail decides each call's error.
type fakeAppender struct {
	mu      sync.Mutex
	batches map[string][][]int64
	fail    func(id string, seqs []int64) error
	block   chan struct{} // when non-nil, Append waits on it
	entered chan struct{}
}

func (f *fakeAppender) Append(_ context.Context, id string, evs []*sessionv1.SessionEvent) error {
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.block != nil {
		<-f.block
	}
	seqs := make([]int64, len(evs))
	for i, ev := range evs {
		seqs[i] = ev.GetSeq()
	}
	if f.fail != nil {
		if err := f.fail(id, seqs); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.batches == nil {
		f.batches = map[string][][]int64{}
	}
	f.batches[id] = append(f.batches[id], seqs)
	return nil
}

func evs(from, to int64) []*sessionv1.SessionEvent {
	var out []*sessionv1.SessionEvent
	for s := from; s < to; s++ {
		out = append(out, &sessionv1.SessionEvent{Seq: s})
	}
	return out
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s < to; s++ {
		out = append(out, s)
	}
	return out
}

func TestBufferFlush(t *testing.T) {
	t.Parallel()
	f := &fakeAppender{}
	b := persistence.NewBuffer(f)
	if err := b.Flush(t.Context(), "s"); err != nil {
		t.Fatalf("empty Flush: %v", err)
	}
	b.Add("s", evs(0, 3)...)
	b.Add("s", evs(3, 5)...)
	b.Add("other", evs(0, 1)...)
	if err := b.Flush(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	if got, want := f.batches["s"], [][]int64{seqRange(0, 5)}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches = %v, want %v", got, want)
	}
	if b.Pending("s") != 0 || b.Pending("other") != 1 {
		t.Fatalf("Pending s=%d other=%d, want 0 and 1", b.Pending("s"), b.Pending("other"))
	}
	if left := b.Forget("other"); len(left) != 1 {
		t.Fatalf("Forget returned %d events, want 1", len(left))
	}
}

func TestBufferKeepsEventsOnFailure(t *testing.T) {
	t.Parallel()
	failures := 2
	f := &fakeAppender{fail: func(string, []int64) error {
		if failures > 0 {
			failures--
			return errors.New("disk full")
		}
		return nil
	}}
	b := persistence.NewBuffer(f)
	b.Add("s", evs(0, 4)...)
	for i := range 2 {
		if err := b.Flush(t.Context(), "s"); err == nil {
			t.Fatalf("flush %d succeeded", i)
		}
		b.Add("s", evs(int64(4+i), int64(5+i))...) // the log runs ahead
	}
	if b.Pending("s") != 6 {
		t.Fatalf("Pending = %d, want 6", b.Pending("s"))
	}
	if err := b.Flush(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	if got, want := f.batches["s"], [][]int64{seqRange(0, 6)}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches = %v, want %v", got, want)
	}
}

func TestBufferTrimsStoredPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		want      int64 // the store's next seq
		wantErr   bool
		wantBatch []int64
		pending   int
	}{
		{"part stored", 3, false, seqRange(3, 6), 0},
		{"all stored", 6, false, nil, 0},
		{"store behind", 0, true, nil, 5},
		{"store ahead", 9, true, nil, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeAppender{fail: func(id string, seqs []int64) error {
				if seqs[0] != tt.want {
					return &persistence.SeqError{SessionID: id, Index: 0, Want: tt.want, Got: seqs[0]}
				}
				return nil
			}}
			b := persistence.NewBuffer(f)
			b.Add("s", evs(1, 6)...)
			err := b.Flush(t.Context(), "s")
			if (err != nil) != tt.wantErr {
				t.Fatalf("Flush: %v, want error %v", err, tt.wantErr)
			}
			var got []int64
			if bs := f.batches["s"]; len(bs) > 0 {
				got = bs[0]
			}
			if !slices.Equal(got, tt.wantBatch) {
				t.Fatalf("stored batch %v, want %v", got, tt.wantBatch)
			}
			if b.Pending("s") != tt.pending {
				t.Fatalf("Pending = %d, want %d", b.Pending("s"), tt.pending)
			}
		})
	}
}

// TestBufferAddDuringFlush: events added while a flush runs wait for the
// next one and are neither lost nor duplicated.
func TestBufferAddDuringFlush(t *testing.T) {
	t.Parallel()
	f := &fakeAppender{block: make(chan struct{}), entered: make(chan struct{})}
	b := persistence.NewBuffer(f)
	b.Add("s", evs(0, 2)...)
	done := make(chan error)
	go func() { done <- b.Flush(t.Context(), "s") }()
	<-f.entered
	b.Add("s", evs(2, 4)...)
	f.block <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b.Pending("s") != 2 {
		t.Fatalf("Pending = %d, want 2", b.Pending("s"))
	}
	go func() { <-f.entered; f.block <- struct{}{} }()
	if err := b.Flush(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	if got, want := f.batches["s"], [][]int64{{0, 1}, {2, 3}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches = %v, want %v", got, want)
	}
}

func TestBufferFlushAll(t *testing.T) {
	t.Parallel()
	f := &fakeAppender{fail: func(id string, _ []int64) error {
		if id == "bad" {
			return fmt.Errorf("session %s: disk full", id)
		}
		return nil
	}}
	b := persistence.NewBuffer(f)
	for _, id := range []string{"a", "bad", "c"} {
		b.Add(id, evs(0, 2)...)
	}
	err := b.FlushAll(t.Context())
	if err == nil || b.Pending("bad") != 2 || b.Pending("a") != 0 || b.Pending("c") != 0 {
		t.Fatalf("FlushAll: %v; pending a=%d bad=%d c=%d", err, b.Pending("a"), b.Pending("bad"), b.Pending("c"))
	}
}

func TestErrorCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		code string
	}{
		{fmt.Errorf("x: %w", persistence.ErrNotFound), persistence.CodeNotFound},
		{fmt.Errorf("x: %w", persistence.ErrExists), persistence.CodeExists},
		{fmt.Errorf("x: %w", persistence.ErrUnknownVersion), persistence.CodeUnknownVersion},
		{&persistence.SeqError{}, persistence.CodeSeq},
		{fmt.Errorf("wrapped: %w", &persistence.CorruptError{Seq: -1, Err: errors.New("x")}), persistence.CodeCorrupt},
		{&persistence.InvalidEventError{Type: "tool/call", Err: errors.New("x")}, persistence.CodeInvalidEvent},
		{&persistence.CursorError{}, persistence.CodeCursor},
		{errors.New("plain"), ""},
	}
	for _, tt := range tests {
		if got := persistence.Code(tt.err); got != tt.code {
			t.Errorf("Code(%v) = %q, want %q", tt.err, got, tt.code)
		}
	}
}
