package chat

import (
	stdjson "encoding/json"
	"testing"

	segjson "github.com/segmentio/encoding/json"
)

var benchChunk = []byte(`{"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1764370000,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_6f2","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}],"usage":null}`)

var benchToolChunk = []byte(`{"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1764370000,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_6f2","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ommand\":\"ls"}}]},"logprobs":null,"finish_reason":null}],"usage":null}`)

// BenchmarkDecodeToolChunk compares the full decoder and the fast path on
// one tool-call argument fragment (most of the events of a tool-heavy turn).
func BenchmarkDecodeToolChunk(b *testing.B) {
	b.Run("fast-path", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, ok := parseFast(benchToolChunk); !ok || !d.tool {
				b.Fatal("not on the fast path")
			}
		}
	})
	b.Run("segmentio", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c streamChunk
			if err := segjson.Unmarshal(benchToolChunk, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeChunk compares the decoders on one typical streamed
// chunk: encoding/json, segmentio (the full path), and the fast path.
func BenchmarkDecodeChunk(b *testing.B) {
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c streamChunk
			if err := stdjson.Unmarshal(benchChunk, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast-path", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := parseFast(benchChunk); !ok {
				b.Fatal("not on the fast path")
			}
		}
	})
	b.Run("segmentio", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c streamChunk
			if err := segjson.Unmarshal(benchChunk, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

var benchFinishChunk = []byte(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"load","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)

// BenchmarkDecodeFinishChunk compares the full decoder and the fast path
// on a stream's finish event (once per model request).
func BenchmarkDecodeFinishChunk(b *testing.B) {
	b.Run("fast-path", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, ok := parseFast(benchFinishChunk); !ok || d.finish != "tool_calls" {
				b.Fatal("not on the fast path")
			}
		}
	})
	b.Run("segmentio", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c streamChunk
			if err := segjson.Unmarshal(benchFinishChunk, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
