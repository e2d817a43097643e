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

// historyCodec is the proto codec with one twist for GenerateRequest (and,
// for GenerateResponse, a hand decoder: see Unmarshal and decodeResponse): it
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
// The cache serves a gateway that does not hold the conversation. Once the
// gateway says it holds a request's messages (held), the session's next
// step goes out as a reference plus the messages after it, encoded straight
// into the request's continued fields, and nothing reads the cached
// encodings again unless the reference is refused: held drops them, so a
// loaded session does not keep a second, encoded copy of its whole
// history (it was ~20 % of a `read` session's live heap in the load
// ladder). A refused reference is resent whole, encoded afresh once; while
// the client then sends every step whole (refusedBackoff), held keeps them,
// so each of those steps encodes only its new messages. A one-off of a
// held session (a compaction or title call, sent whole) drops what it
// encoded once its bytes are taken.
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
	// request the gateway remembered as ref; refBytes is the size of
	// refMsgs as encoded message fields (what a reference saves).
	refSystem *string
	refTools  []*llmv1.ToolSchema
	refBytes  int
}

// held records what the gateway answered to a conversation request of a
// session: the id it remembered req under, or none (""); n is the size of
// req's messages as encoded fields (what a reference to them saves, as the
// call's codec marshalled them). Unless keep (the client sends every step
// whole for a while, so the next step reads the cached encodings again),
// the cached encodings go once the gateway holds the conversation.
func (c *historyCodec) held(req *llmv1.GenerateRequest, id string, n int, keep bool) {
	c.mu.Lock()
	se := c.sessions[req.GetSessionId()]
	c.mu.Unlock()
	if se == nil {
		return
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	se.ref, se.refMsgs, se.refSystem, se.refTools, se.refBytes = id, nil, nil, nil, 0
	if id != "" {
		se.refMsgs, se.refSystem, se.refTools, se.refBytes = slices.Clone(req.GetMessages()), req.System, slices.Clone(req.GetTools()), n
		if !keep {
			// The next step refers to these messages: their encodings
			// are not read again (a refused reference re-encodes), so
			// they go.
			se.msgs, se.ends, se.buf = nil, nil, nil
		}
	}
}

// fieldSize is the size of an encoded message field num (tag, length,
// bytes) whose message is n bytes.
func fieldSize(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(n)) + n
}

// appendField appends m as field num (tag, length, bytes) to b, encoded in
// place after its tag and length (proto.Size leaves the sizes of the
// message's parts cached for MarshalAppend): no separate encoding to copy
// in. On an error b is returned as it was.
func appendField(b []byte, num protowire.Number, m *llmv1.Message) ([]byte, error) {
	n := proto.Size(m)
	mark := len(b)
	b = slices.Grow(b, fieldSize(num, n))
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	start := len(b)
	out, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, m)
	if err != nil {
		return b[:mark], err
	}
	if got := len(out) - start; got != n {
		return b[:mark], fmt.Errorf("%d bytes, sized %d (changed while encoded)", got, n)
	}
	return out, nil
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
// request went out as a reference, and histBytes the size of its messages
// as encoded fields (referred or sent: held's n).
type callCodec struct {
	*historyCodec
	full       bool
	referenced atomic.Bool
	histBytes  atomic.Int64
}

func (c *callCodec) Marshal(v any) (mem.BufferSlice, error) {
	bs, ref, n, err := c.marshal(v, c.full)
	if ref {
		c.referenced.Store(true)
	}
	c.histBytes.Store(int64(n))
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

// Unmarshal decodes a GenerateResponse with decodeResponse (each chunk one
// allocation), and one it declines with proto.Unmarshal from the same
// materialised bytes (neither keeps them: decodeResponse's strings are
// substrings of its own copy, proto.Unmarshal copies what it keeps, so the
// pooled buffer is freed after); anything else with gRPC's proto codec.
func (c *historyCodec) Unmarshal(data mem.BufferSlice, v any) error {
	resp, ok := v.(*llmv1.GenerateResponse)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if decodeResponse(b, resp) {
		return nil
	}
	return proto.Unmarshal(b, resp)
}

func (c *historyCodec) forget(sessionID string) {
	c.mu.Lock()
	delete(c.sessions, sessionID)
	c.mu.Unlock()
}

func (c *historyCodec) Marshal(v any) (mem.BufferSlice, error) {
	bs, _, _, err := c.marshal(v, true)
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
// whether the request went out as a reference, and the size of its
// messages as encoded fields (those referred to and those sent; 0 for a
// request that is not a session's).
func (c *historyCodec) marshal(v any, full bool) (mem.BufferSlice, bool, int, error) {
	req, ok := v.(*llmv1.GenerateRequest)
	if !ok {
		bs, err := c.base.Marshal(v)
		return bs, false, 0, err
	}
	if req.GetSessionId() == "" {
		bs, err := c.base.Marshal(v)
		if err == nil && !req.GetBatchChunks() {
			bs = append(bs, mem.SliceBuffer(batchField))
		}
		return bs, false, 0, err
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
		return nil, false, 0, err
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	msgs := req.GetMessages()
	var (
		hist, tail []byte // the history bytes sent: the cached messages fields, or the continued ones after a reference
		size       int    // the size of msgs as encoded fields
	)
	if !full && req.Prefix == nil && conversation(req) && se.ref != "" && len(se.refMsgs) > 0 && len(se.refMsgs) <= len(msgs) && slices.Equal(se.refMsgs, msgs[:len(se.refMsgs)]) {
		// The gateway holds msgs[:len(refMsgs)]: only the messages after
		// them are encoded, as continued fields, and nothing is cached.
		se.msgs, se.ends, se.buf = nil, nil, nil
		ref := &llmv1.PrefixRef{Id: se.ref, Count: uint32(len(se.refMsgs))}
		referred := se.refBytes
		if sameSystem(se.refSystem, req.System) {
			ref.SameSystem, head.System = true, nil
		}
		if len(tools) > 0 && slices.Equal(se.refTools, req.Tools) { // the same schema pointers in the same order
			ref.SameTools, referred, tools = true, referred+len(tools), nil
		}
		head.Prefix = ref
		c.referred.Add(int64(referred))
		tail = []byte{}
		for i := len(se.refMsgs); i < len(msgs); i++ {
			if tail, err = appendField(tail, continuedField, msgs[i]); err != nil {
				return nil, false, 0, fmt.Errorf("marshal history message %d: %w", i, err)
			}
		}
		c.encoded.Add(int64(len(tail)))
		size = se.refBytes + len(tail)
		hist = tail
	} else {
		if err := c.encode(se, msgs); err != nil {
			return nil, false, 0, err
		}
		if req.Prefix != nil {
			head.Prefix, head.Continued = req.Prefix, req.Continued
		}
		n := len(se.buf)
		size, hist = n, se.buf[:n:n]
		if !conversation(req) && se.ref != "" {
			// A one-off (a compaction or title call) of a session whose
			// conversation the gateway holds: the next step refers to
			// that conversation, or after a compaction that rewrote the
			// history goes out whole with new messages, so these
			// encodings are not read again (hist keeps its bytes: the
			// buffer is clipped, never written again).
			se.msgs, se.ends, se.buf = nil, nil, nil
		}
	}
	out, err := proto.Marshal(head)
	if err != nil {
		return nil, false, 0, fmt.Errorf("marshal request: %w", err)
	}
	bs := mem.BufferSlice{mem.SliceBuffer(out)}
	if len(tools) > 0 {
		bs = append(bs, mem.SliceBuffer(tools))
	}
	if len(hist) > 0 {
		bs = append(bs, mem.SliceBuffer(hist))
	}
	return bs, tail != nil, size, nil
}

// encode brings the cache to msgs: the longest leading run of messages that
// are the very same as the cached ones keeps its bytes, the rest is encoded
// after it (into a new buffer when a cached message changed: bytes handed
// out are never written again). It counts the bytes encoded and reused.
// se.mu must be held.
func (c *historyCodec) encode(se *sessionEnc, msgs []*llmv1.Message) error {
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
	reused := len(se.buf)
	for i := k; i < len(msgs); i++ {
		var err error
		if se.buf, err = appendField(se.buf, messagesField, msgs[i]); err != nil {
			return fmt.Errorf("marshal history message %d: %w", i, err)
		}
		se.msgs, se.ends = append(se.msgs, msgs[i]), append(se.ends, len(se.buf))
	}
	c.encoded.Add(int64(len(se.buf) - reused))
	c.reused.Add(int64(reused))
	return nil
}
