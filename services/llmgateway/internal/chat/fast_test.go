package chat

import (
	"bytes"
	"testing"

	json "github.com/segmentio/encoding/json"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/fragment"
)

var fastSeeds = []string{
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}`,
	`{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"think \u00e9"}}]}`,
	`{"choices":[{"index":0,"delta":{"reasoning":"r"}}],"obfuscation":"x"}`,
	`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`,
	`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
	`{"error":{"message":"boom"}}`,
	`{"choices":[{"index":1,"delta":{"content":"x"}}]}`,
	`{"Choices":[{"index":0,"delta":{"content":"x"}}],"choices":[{"index":0,"delta":{"content":"y"}}]}`,
	`{"choices":[{"index":0,"delta":{"content":"x","content":"y"}}]}`,
	`{"choices":[{"index":0,"delta":{"content":"x"}}],}`,
	`{"choices":[{"index":0,"delta":{"content":"x"}}]} trailing`,
	`{"a":[1,2.5e3,-0,true,false,null,{"b":"\""}],"choices":[{"index":0,"delta":{"content":"q"}}]}`,
	"{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\xc3\"}}]}",
	`{"choices":[{"index":0e1,"delta":{"content":"x"}}]}`,
}

func TestFastPathShapes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		ok   bool
		text string
	}{
		{fastSeeds[0], true, "tok"},
		{fastSeeds[1], true, ""},
		{fastSeeds[2], true, "think é"},
		{fastSeeds[3], true, "r"},
		{fastSeeds[4], false, ""},  // finish reason: full decoder
		{fastSeeds[5], false, ""},  // tool calls
		{fastSeeds[6], false, ""},  // usage
		{fastSeeds[7], false, ""},  // error
		{fastSeeds[8], false, ""},  // another choice
		{fastSeeds[9], false, ""},  // a key that aliases choices
		{fastSeeds[10], false, ""}, // duplicate key
		{fastSeeds[11], false, ""}, // trailing comma
		{fastSeeds[12], false, ""}, // trailing bytes
		{fastSeeds[13], true, "q"},
	}
	for _, tt := range tests {
		d, ok := parseFast([]byte(tt.in))
		if ok != tt.ok {
			t.Errorf("parseFast(%s) ok = %v, want %v", tt.in, ok, tt.ok)
			continue
		}
		if ok {
			r, _ := fragment.Unquote(nil, d.reasoningText())
			c, _ := fragment.Unquote(nil, d.content)
			if got := string(r) + string(c); got != tt.text {
				t.Errorf("parseFast(%s) text = %q, want %q", tt.in, got, tt.text)
			}
		}
	}
}

// FuzzFastDelta: whenever the fast path accepts an event, the full decoder
// accepts it too and extracts the same text, so which path ran never
// changes the stream.
func FuzzFastDelta(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fd, ok := parseFast(data)
		if !ok {
			return
		}
		var c streamChunk
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("fast path accepted what the decoder rejects (%v): %q", err, data)
		}
		if c.Error != nil || c.Usage != nil || len(c.Choices) != 1 || c.Choices[0].Index != 0 || c.Choices[0].FinishReason != "" || len(c.Choices[0].Delta.ToolCalls) != 0 {
			t.Fatalf("fast path accepted a non-text event: %q", data)
		}
		fr, err1 := fragment.Unquote(nil, fd.reasoningText())
		fc, err2 := fragment.Unquote(nil, fd.content)
		sr, err3 := fragment.Unquote(nil, c.Choices[0].Delta.reasoning())
		sc, err4 := fragment.Unquote(nil, c.Choices[0].Delta.Content)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			t.Fatalf("unquote: %v %v %v %v on %q", err1, err2, err3, err4, data)
		}
		if !bytes.Equal(fr, sr) || !bytes.Equal(fc, sc) {
			t.Fatalf("paths disagree on %q: fast (%q, %q) full (%q, %q)", data, fr, fc, sr, sc)
		}
	})
}
