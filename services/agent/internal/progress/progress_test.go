package progress_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/progress"
)

func msg(text string) *agentv1.ToolProgress {
	return &agentv1.ToolProgress{CallId: "c", Output: &toolsv1.ToolOutput{Stream: "stdout", Text: text}}
}

// A subscriber that never reads loses what does not fit its buffer,
// counted; the publisher never blocks and a reading subscriber gets
// everything in order.
func TestSlowSubscriberDropsNeverBlocks(t *testing.T) {
	t.Parallel()
	h := progress.NewHub()
	if h.Active() {
		t.Fatal("active without subscribers")
	}
	slow := h.Subscribe(2)
	fast := h.Subscribe(100)
	for i := range 10 {
		h.Publish(msg(strings.Repeat("x", i)))
	}
	if slow.Dropped() != 8 || fast.Dropped() != 0 || h.Dropped() != 8 {
		t.Fatalf("dropped slow %d fast %d hub %d, want 8 0 8", slow.Dropped(), fast.Dropped(), h.Dropped())
	}
	for i := range 10 {
		if got := (<-fast.C()).GetOutput().GetText(); len(got) != i {
			t.Fatalf("message %d has %d bytes", i, len(got))
		}
	}
	if got := (<-slow.C()).GetOutput().GetText(); got != "" {
		t.Fatalf("slow got %q first, want the oldest", got)
	}
	slow.Close()
	fast.Close()
	if h.Active() {
		t.Fatal("active after every subscriber closed")
	}
	h.Publish(msg("nobody")) // no subscriber: nothing to do, nothing blocks
}

// Output over MaxText is cut at a rune boundary and marked.
func TestPublishBoundsText(t *testing.T) {
	t.Parallel()
	h := progress.NewHub()
	s := h.Subscribe(1)
	h.Publish(msg("a" + strings.Repeat("é", progress.MaxText)))
	got := (<-s.C()).GetOutput().GetText()
	if !utf8.ValidString(got) || len(got) > progress.MaxText+64 || !strings.HasSuffix(got, "[progress output truncated]\n") {
		t.Fatalf("bounded text: %d bytes, valid %v, suffix %q", len(got), utf8.ValidString(got), got[len(got)-30:])
	}
}

func BenchmarkPublish(b *testing.B) {
	h := progress.NewHub()
	subs := []*progress.Sub{h.Subscribe(0), h.Subscribe(0), h.Subscribe(1)}
	done := make(chan struct{})
	for _, s := range subs[:2] {
		go func() {
			for {
				select {
				case <-s.C():
				case <-done:
					return
				}
			}
		}()
	}
	m := msg("a line of tool output\n")
	b.ReportAllocs()
	for b.Loop() {
		h.Publish(m)
	}
	close(done)
}
