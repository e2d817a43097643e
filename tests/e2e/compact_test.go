package e2e

import (
	"regexp"
	"strings"
	"testing"
)

// TestChatCompact: the chat's status line shows the context gauge after a
// turn, and /compact summarizes the older context, shown as the
// compaction card (the long tool output is pruned first).
func TestChatCompact(t *testing.T) {
	t.Parallel()
	const long = `{"models":[{"id":"scripted","context_window":128000}],"steps":[
 {"text":"Counting.","tool_calls":[{"name":"bash","arguments":{"command":"seq 1 3000","description":"count"}}]},
 {"text":"Counted to 3000."}]}`
	term, write, _ := startDevPTY(t, long, "--yes")
	term.waitFor(t, "the prompt", atPrompt)
	write([]byte("count for me\r"))
	gauge := regexp.MustCompile(`\[\d+% of 128k\] ›`)
	term.waitFor(t, "the answer and the gauge", func(s string) bool {
		return strings.Contains(s, "Counted to 3000.") && gauge.MatchString(s) && atPrompt(s)
	})
	write([]byte("and once more\r")) // a second turn: the first one becomes older context
	term.waitFor(t, "the second answer", func(s string) bool {
		return strings.Count(s, "Counted to 3000.") == 2 && atPrompt(s)
	})
	write([]byte("/compact\r"))
	s := term.waitFor(t, "the compaction card", func(s string) bool {
		return strings.Contains(s, "compacted: ") && atPrompt(s)
	})
	for _, want := range []string{"compacting the context (manual)", "⟲ compacted 5 messages", "Scripted summary of 5 messages", "2 long tool outputs pruned"} {
		if !strings.Contains(s, want) {
			t.Errorf("the screen lacks %q:\n%s", want, s)
		}
	}
}
