package fakes

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// SkipHistoryCodec is a server codec for benchmarks: it decodes a
// GenerateRequest without its messages (counting them in the request's
// Purpose-free copy only), so the fake gateway's decoding of a long history
// does not eat the CPU the agent is being measured on. Everything else is
// plain proto.
type SkipHistoryCodec struct{}

// Name is "proto".
func (SkipHistoryCodec) Name() string { return "proto" }

// Marshal is plain proto.
func (SkipHistoryCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2("proto").Marshal(v)
}

// Unmarshal skips field 3 (messages) of a GenerateRequest.
func (SkipHistoryCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*llmv1.GenerateRequest)
	if !ok {
		return encoding.GetCodecV2("proto").Unmarshal(data, v)
	}
	b := data.Materialize()
	var keep []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		if num != 3 {
			keep = append(keep, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return proto.Unmarshal(keep, req)
}
