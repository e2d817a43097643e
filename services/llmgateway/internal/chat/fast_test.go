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
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_9","type":"function","function":{"name":"bash","arguments":""}}]},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a\u00e9"}},{"index":1}]}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":01,"function":{"arguments":"x"}}]}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c\u0041","function":{"arguments":"x"}}]}}]}`,
	"{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"b\xff\",\"arguments\":\"x\"}}]}}]}",
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"load","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	`{"choices":[{"index":0,"delta":{},"finish_reason":"st\u006fp"}]}`,
	`{"choices":[{"index":0,"delta":{},"finish_reason":"stop","finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{},"finish_reason":""}]}`,
}

func TestFastPathShapes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		ok     bool
		text   string
		finish string
	}{
		{fastSeeds[0], true, "tok", ""},
		{fastSeeds[1], true, "", ""},
		{fastSeeds[2], true, "think é", ""},
		{fastSeeds[3], true, "r", ""},
		{fastSeeds[4], true, "a", "stop"},
		{fastSeeds[5], true, "{", ""},  // one tool call's fragment
		{fastSeeds[6], false, "", ""},  // usage
		{fastSeeds[7], false, "", ""},  // error
		{fastSeeds[8], false, "", ""},  // another choice
		{fastSeeds[9], false, "", ""},  // a key that aliases choices
		{fastSeeds[10], false, "", ""}, // duplicate key
		{fastSeeds[11], false, "", ""}, // trailing comma
		{fastSeeds[12], false, "", ""}, // trailing bytes
		{fastSeeds[13], true, "q", ""},
		{fastSeeds[16], true, "", ""},  // a tool call's opening delta
		{fastSeeds[17], false, "", ""}, // two tool calls: full decoder
		{fastSeeds[18], false, "", ""}, // a leading zero
		{fastSeeds[19], false, "", ""}, // an escaped id
		{fastSeeds[20], false, "", ""}, // a name that is not UTF-8
		{fastSeeds[21], true, "", "tool_calls"},
		{fastSeeds[22], false, "", ""}, // an escaped finish reason: full decoder
		{fastSeeds[23], false, "", ""}, // a duplicate finish reason
		{fastSeeds[24], true, "", ""},
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
			a, _ := fragment.Unquote(nil, d.args)
			if got := string(r) + string(c) + string(a); got != tt.text {
				t.Errorf("parseFast(%s) text = %q, want %q", tt.in, got, tt.text)
			}
			if d.finish != tt.finish {
				t.Errorf("parseFast(%s) finish = %q, want %q", tt.in, d.finish, tt.finish)
			}
		}
	}
}

// FuzzFastDelta: whenever the fast path accepts an event, the full decoder
// accepts it too and extracts the same text and tool call (index, id, name,
// arguments), so which path ran never changes the stream.
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
		if c.Error != nil || c.Usage != nil || len(c.Choices) != 1 || c.Choices[0].Index != 0 {
			t.Fatalf("fast path accepted an event with more than deltas: %q", data)
		}
		if fd.finish != c.Choices[0].FinishReason {
			t.Fatalf("paths disagree on the finish reason of %q: fast %q, full %q", data, fd.finish, c.Choices[0].FinishReason)
		}
		tcs := c.Choices[0].Delta.ToolCalls
		if fd.tool != (len(tcs) == 1) || len(tcs) > 1 {
			t.Fatalf("fast path saw tool call %v, the decoder %d: %q", fd.tool, len(tcs), data)
		}
		if fd.tool {
			tc := tcs[0]
			fa, err1 := fragment.Unquote(nil, fd.args)
			sa, err2 := fragment.Unquote(nil, tc.Function.Arguments)
			if err1 != nil || err2 != nil || !bytes.Equal(fa, sa) || fd.toolIndex != tc.Index || fd.toolID != tc.ID || fd.toolName != tc.Function.Name {
				t.Fatalf("paths disagree on the tool call of %q: fast (%d %q %q %q) full (%d %q %q %q) %v %v", data,
					fd.toolIndex, fd.toolID, fd.toolName, fa, tc.Index, tc.ID, tc.Function.Name, sa, err1, err2)
			}
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
