package gateway

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// historyCodec is the proto codec with one twist for GenerateRequest: it
// keeps, per session, the wire bytes of the history messages of the previous
// request, and reuses them for every message that is the very same (pointer-
// identical, hence unchanged: the log hands out immutable shared messages) at
// the same position. A step then encodes only the messages appended since the
// last request and copies the rest, instead of re-encoding the whole history.
// Forget drops a session's entry (the service calls it when the session
// unloads).
type historyCodec struct {
	base     encoding.CodecV2
	mu       sync.Mutex
	sessions map[string]*sessionEnc
}

type sessionEnc struct {
	mu   sync.Mutex
	msgs []*llmv1.Message
	enc  [][]byte
}

func newHistoryCodec() *historyCodec {
	return &historyCodec{base: encoding.GetCodecV2("proto"), sessions: map[string]*sessionEnc{}}
}

// Name is "proto": the wire format is plain protobuf.
func (c *historyCodec) Name() string { return "proto" }

func (c *historyCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }

func (c *historyCodec) forget(sessionID string) {
	c.mu.Lock()
	delete(c.sessions, sessionID)
	c.mu.Unlock()
}

func (c *historyCodec) Marshal(v any) (mem.BufferSlice, error) {
	req, ok := v.(*llmv1.GenerateRequest)
	if !ok || req.GetSessionId() == "" {
		return c.base.Marshal(v)
	}
	c.mu.Lock()
	se := c.sessions[req.GetSessionId()]
	if se == nil {
		se = &sessionEnc{}
		c.sessions[req.GetSessionId()] = se
	}
	c.mu.Unlock()

	head := &llmv1.GenerateRequest{Provider: req.Provider, Model: req.Model, System: req.System, Tools: req.Tools,
		Temperature: req.Temperature, MaxTokens: req.MaxTokens, Stop: req.Stop, SessionId: req.SessionId, Purpose: req.Purpose}
	se.mu.Lock()
	defer se.mu.Unlock()
	msgs := req.GetMessages()
	size := proto.Size(head)
	for i, m := range msgs {
		if i < len(se.msgs) && se.msgs[i] == m {
			size += 1 + protowire.SizeBytes(len(se.enc[i]))
		} else {
			size += 1 + protowire.SizeBytes(proto.Size(m))
		}
	}
	out, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, size), head)
	if err != nil {
		return nil, fmt.Errorf("marshal request: %w", err)
	}
	for i, m := range msgs {
		var b []byte
		if i < len(se.msgs) && se.msgs[i] == m {
			b = se.enc[i]
		} else {
			if b, err = proto.Marshal(m); err != nil {
				return nil, fmt.Errorf("marshal history message %d: %w", i, err)
			}
			if i < len(se.msgs) {
				se.msgs[i], se.enc[i] = m, b
			} else {
				se.msgs, se.enc = append(se.msgs, m), append(se.enc, b)
			}
		}
		out = protowire.AppendTag(out, 3, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	se.msgs, se.enc = se.msgs[:len(msgs)], se.enc[:len(msgs)]
	return mem.BufferSlice{mem.SliceBuffer(out)}, nil
}
