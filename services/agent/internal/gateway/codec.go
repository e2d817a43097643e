package gateway

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// historyCodec is the proto codec with one twist for GenerateRequest: it
// keeps, per session, the wire bytes of the history messages of the previous
// request, and reuses them for the longest leading run of messages that are
// the very same (pointer-identical, hence unchanged: the log hands out
// immutable shared messages) at the same position. A step then encodes only
// the messages appended since the last request, instead of re-encoding the
// whole history; a change at position i (a compaction) re-encodes from i on.
//
// The cached history is one contiguous buffer of encoded message fields that
// Marshal hands to gRPC as it is, next to a freshly encoded head, so the
// history is not copied either (gRPC's transport copies it into frames once).
// A buffer handed out is never written again: appends only write past its
// end, and a change re-encodes into a new buffer (the cached one is clipped),
// so a request still being written by the transport keeps its bytes.
// Forget drops a session's entry (the service calls it when the session
// unloads).
//
// The tool schemas get the same treatment across sessions: the loop hands
// every step of every session the same shared schema list until a host's
// tools change, so their encoding (the largest part of a request's head,
// and most of its marshalling cost) is kept once and reused while the
// schemas are the very same pointers in the same order.
type historyCodec struct {
	base     encoding.CodecV2
	tools    toolsEnc
	mu       sync.Mutex
	sessions map[string]*sessionEnc
	// encoded and reused count history bytes encoded afresh and taken
	// from the cache, over every request (EncodeStats); referred counts
	// the history bytes not sent because the gateway held them.
	encoded, reused, referred atomic.Int64
}

// sessionEnc is one session's cache: buf[:ends[i]] holds the encoded message
// fields (tag, length, bytes) of msgs[:i+1]. ref is the id under which the
// gateway said it remembered the conversation refMsgs (the messages of the
// session's last conversation request), "" when none is known.
type sessionEnc struct {
	mu      sync.Mutex
	msgs    []*llmv1.Message
	ends    []int
	buf     []byte
	ref     string
	refMsgs []*llmv1.Message
	// refSystem and refTools are the system prompt and tools of the
	// request the gateway remembered as ref.
	refSystem *string
	refTools  []*llmv1.ToolSchema
}

// held records what the gateway answered to a conversation request of a
// session: the id it remembered req under, or none ("").
func (c *historyCodec) held(req *llmv1.GenerateRequest, id string) {
	c.mu.Lock()
	se := c.sessions[req.GetSessionId()]
	c.mu.Unlock()
	if se == nil {
		return
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	se.ref, se.refMsgs, se.refSystem, se.refTools = id, nil, nil, nil
	if id != "" {
		se.refMsgs, se.refSystem, se.refTools = slices.Clone(req.GetMessages()), req.System, slices.Clone(req.GetTools())
	}
}

// sameSystem reports whether two optional system prompts are the same.
func sameSystem(a, b *string) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// conversation reports whether req is a step of a session's conversation:
// a request the gateway is asked to remember (the loop asks for its steps;
// a title or compaction call is a one-off), which may name the session's
// previous one.
func conversation(req *llmv1.GenerateRequest) bool {
	return req.GetSessionId() != "" && req.GetRememberPrefix()
}

// callCodec is the codec of one Generate call: full sends the whole
// conversation even when the gateway is believed to hold its beginning
// (the resend after a refused reference); referenced reports whether the
// request went out as a reference.
type callCodec struct {
	*historyCodec
	full       bool
	referenced atomic.Bool
}

func (c *callCodec) Marshal(v any) (mem.BufferSlice, error) {
	bs, ref, err := c.marshal(v, c.full)
	if ref {
		c.referenced.Store(true)
	}
	return bs, err
}

// toolsEnc is the encoded tools field (tag, length, bytes per schema) of
// the schema list tools. buf is never written again once handed out.
type toolsEnc struct {
	mu    sync.Mutex
	tools []*llmv1.ToolSchema
	buf   []byte
}

// encode returns the encoded tools field of tools.
func (t *toolsEnc) encode(tools []*llmv1.ToolSchema) ([]byte, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.Equal(t.tools, tools) { // the same schema pointers in the same order
		return t.buf, nil
	}
	var buf []byte
	for i, ts := range tools {
		b, err := proto.Marshal(ts)
		if err != nil {
			return nil, fmt.Errorf("marshal tool schema %d: %w", i, err)
		}
		buf = protowire.AppendTag(buf, 5, protowire.BytesType)
		buf = protowire.AppendBytes(buf, b)
	}
	t.tools, t.buf = slices.Clone(tools), buf[:len(buf):len(buf)]
	return t.buf, nil
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
	bs, _, err := c.marshal(v, true)
	return bs, err
}

// The field numbers of GenerateRequest.messages and .continued.
const (
	messagesField  protowire.Number = 3
	continuedField protowire.Number = 14
)

// batchField is GenerateRequest.batch_chunks = true as encoded fields
// (field 15, varint 1). Every request this client sends carries it (the
// client takes batched responses, see attempt): a request's head is built
// with it, and a request encoded whole gets these two bytes appended (a
// field may follow the others in any order). A gateway that predates the
// field skips it and sends one chunk per response. Never written.
var batchField = protowire.AppendVarint(protowire.AppendTag(nil, 15, protowire.VarintType), 1)

// marshal encodes v; a conversation request is sent as a reference to the
// conversation the gateway holds plus the messages after it (in
// `continued`, `messages` left empty: a gateway that predates references
// refuses it instead of answering the tail alone), unless full. It reports
// whether the request went out as a reference.
func (c *historyCodec) marshal(v any, full bool) (mem.BufferSlice, bool, error) {
	req, ok := v.(*llmv1.GenerateRequest)
	if !ok {
		bs, err := c.base.Marshal(v)
		return bs, false, err
	}
	if req.GetSessionId() == "" {
		bs, err := c.base.Marshal(v)
		if err == nil && !req.GetBatchChunks() {
			bs = append(bs, mem.SliceBuffer(batchField))
		}
		return bs, false, err
	}
	c.mu.Lock()
	se := c.sessions[req.GetSessionId()]
	if se == nil {
		se = &sessionEnc{}
		c.sessions[req.GetSessionId()] = se
	}
	c.mu.Unlock()

	head := &llmv1.GenerateRequest{Provider: req.Provider, Model: req.Model, System: req.System,
		Temperature: req.Temperature, MaxTokens: req.MaxTokens, Stop: req.Stop, SessionId: req.SessionId, Purpose: req.Purpose,
		Tenant: req.Tenant, RememberPrefix: req.RememberPrefix, BatchChunks: true}
	tools, err := c.tools.encode(req.Tools)
	if err != nil {
		return nil, false, err
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	msgs := req.GetMessages()
	k := 0
	for k < len(msgs) && k < len(se.msgs) && se.msgs[k] == msgs[k] {
		k++
	}
	if k < len(se.msgs) {
		// Bytes past position k may belong to a request in flight: clip the
		// buffer so that the re-encoding below goes to a new one.
		end := 0
		if k > 0 {
			end = se.ends[k-1]
		}
		se.buf = se.buf[:end:end]
		se.msgs, se.ends = se.msgs[:k], se.ends[:k]
	}
	for i := k; i < len(msgs); i++ {
		// Encoded in place after its tag and length (proto.Size leaves
		// the sizes of the message's parts cached for MarshalAppend): no
		// separate encoding to copy in.
		n := proto.Size(msgs[i])
		mark := len(se.buf)
		se.buf = slices.Grow(se.buf, protowire.SizeTag(messagesField)+protowire.SizeVarint(uint64(n))+n)
		se.buf = protowire.AppendTag(se.buf, messagesField, protowire.BytesType)
		se.buf = protowire.AppendVarint(se.buf, uint64(n))
		start := len(se.buf)
		out, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(se.buf, msgs[i])
		if err != nil {
			se.buf = se.buf[:mark] // no partial message left for the next request to extend
			return nil, false, fmt.Errorf("marshal history message %d: %w", i, err)
		}
		if got := len(out) - start; got != n {
			se.buf = se.buf[:mark]
			return nil, false, fmt.Errorf("marshal history message %d: %d bytes, sized %d (changed while encoded)", i, got, n)
		}
		se.buf = out
		se.msgs, se.ends = append(se.msgs, msgs[i]), append(se.ends, len(se.buf))
	}
	fresh := 0
	if k < len(se.ends) {
		fresh = len(se.buf)
		if k > 0 {
			fresh -= se.ends[k-1]
		}
	}
	c.encoded.Add(int64(fresh))
	c.reused.Add(int64(len(se.buf) - fresh))
	from := 0       // the history bytes sent: buf[from:]
	var tail []byte // the messages after a reference, as continued fields
	if !full && req.Prefix == nil && conversation(req) && se.ref != "" && len(se.refMsgs) > 0 && len(se.refMsgs) <= len(msgs) && slices.Equal(se.refMsgs, msgs[:len(se.refMsgs)]) {
		ref := &llmv1.PrefixRef{Id: se.ref, Count: uint32(len(se.refMsgs))}
		from = se.ends[len(se.refMsgs)-1]
		referred := from
		if sameSystem(se.refSystem, req.System) {
			ref.SameSystem, head.System = true, nil
		}
		if len(tools) > 0 && slices.Equal(se.refTools, req.Tools) { // the same schema pointers in the same order
			ref.SameTools, referred, tools = true, referred+len(tools), nil
		}
		head.Prefix = ref
		c.referred.Add(int64(referred))
		// The same encodings under the continued field number (a copy:
		// the tail is only what is new since the last step).
		tail = make([]byte, 0, len(se.buf)-from+len(msgs)-len(se.refMsgs))
		for i := len(se.refMsgs); i < len(msgs); i++ {
			start := se.ends[i-1]
			_, _, n := protowire.ConsumeTag(se.buf[start:])
			tail = protowire.AppendTag(tail, continuedField, protowire.BytesType)
			tail = append(tail, se.buf[start+n:se.ends[i]]...)
		}
	} else if req.Prefix != nil {
		head.Prefix, head.Continued = req.Prefix, req.Continued
	}
	out, err := proto.Marshal(head)
	if err != nil {
		return nil, false, fmt.Errorf("marshal request: %w", err)
	}
	bs := mem.BufferSlice{mem.SliceBuffer(out)}
	if len(tools) > 0 {
		bs = append(bs, mem.SliceBuffer(tools))
	}
	switch n := len(se.buf); {
	case tail != nil:
		if len(tail) > 0 {
			bs = append(bs, mem.SliceBuffer(tail))
		}
	case n > from:
		bs = append(bs, mem.SliceBuffer(se.buf[from:n:n]))
	}
	return bs, tail != nil, nil
}
