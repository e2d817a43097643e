package llmgateway

import (
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/prefix"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// Remembered conversations (GenerateRequest.prefix, docs/API.md): a request
// may name an earlier request's conversation and carry only the messages
// appended since. The gateway keeps the decoded messages and, beside them,
// the route's encoding of their request body, so a step decodes, validates
// and encodes only what is new.

// The remembered-conversation protocol's names (docs/API.md).
const (
	// PrefixHeader is the response header naming the id under which a
	// request's conversation was remembered.
	PrefixHeader = "dsh-prefix-id"
	// ReasonPrefixNotCached is the ErrorInfo reason of the
	// FAILED_PRECONDITION a request gets when the conversation it names
	// is not held: send the whole request again.
	ReasonPrefixNotCached = "PREFIX_NOT_CACHED"
	// ErrorDomain is the ErrorInfo domain of the gateway's errors.
	ErrorDomain = "llmgateway.dsh.dev"
)

// DefaultPrefixCacheBytes bounds the remembered conversations when the
// configuration does not (wire bytes of the messages plus the encoded
// bodies kept beside them; the decoded messages take a small multiple).
const DefaultPrefixCacheBytes = 128 << 20

// errPrefixMiss answers a reference the gateway does not hold. The
// message never says why (another tenant's id looks like any other miss).
// Built on first use: its detail's marshal set up protobuf's Any and
// ErrorInfo types at every start of a program linking the gateway.
var errPrefixMiss = sync.OnceValue(func() error {
	st := status.New(codes.FailedPrecondition, "the conversation named by prefix is not held by this gateway (restarted, another replica, or forgotten): send the whole request")
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonPrefixNotCached, Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
})

// resolve puts the messages (and, when the reference says so, the system
// prompt and tools) that req's prefix reference names into req, in place
// (req is the handler's own decoded request), followed by the messages it
// continues with, and returns the entry it continues (nil without a
// reference) and the messages new in req (all of them without one).
//
// A referenced request carries its new messages in `continued` and none in
// `messages`: a gateway that predates `prefix` ignores the reference and
// `continued`, and refuses the request as having no messages
// (INVALID_ARGUMENT) instead of answering a truncated conversation.
func (s *Service) resolve(req *llmv1.GenerateRequest) (*prefix.Entry, []*llmv1.Message, error) {
	ref := req.GetPrefix()
	if ref == nil {
		if len(req.GetContinued()) > 0 {
			return nil, nil, &provider.RequestError{Field: "continued", Reason: "must be empty when prefix is unset (a whole request's messages go in messages)"}
		}
		return nil, req.GetMessages(), nil
	}
	if len(req.GetMessages()) > 0 {
		return nil, nil, &provider.RequestError{Field: "messages", Reason: "must be empty when prefix is set (the messages after the referenced conversation go in continued)"}
	}
	if s.prefixes == nil {
		return nil, nil, errPrefixMiss()
	}
	e, ok := s.prefixes.Get(req.GetTenant(), ref.GetId(), int(ref.GetCount()))
	if !ok {
		return nil, nil, errPrefixMiss()
	}
	head := int64(0) // the wire size of the system prompt and tools this request uses
	if ref.GetSameTools() {
		if len(req.GetTools()) > 0 {
			return nil, nil, &provider.RequestError{Field: "tools", Reason: "must be empty when prefix.same_tools is set"}
		}
		req.Tools = e.Tools
		head += e.ToolBytes()
	} else {
		for _, t := range req.GetTools() {
			head += int64(proto.Size(t))
		}
	}
	if ref.GetSameSystem() {
		if req.System != nil {
			return nil, nil, &provider.RequestError{Field: "system", Reason: "must be unset when prefix.same_system is set"}
		}
		req.System = e.System
	}
	head += int64(len(req.GetSystem()))
	added := req.Continued
	if size := e.MessageBytes() + int64(sizeOf(added)) + head; size > MaxRequestBytes {
		// The limit a whole request has on the wire holds for the
		// conversation assembled here too (the same answer gRPC gives).
		return nil, nil, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d): the conversation named by prefix plus the new messages", size, MaxRequestBytes)
	}
	msgs := make([]*llmv1.Message, 0, len(e.Messages)+len(added))
	req.Messages, req.Continued = append(append(msgs, e.Messages...), added...), nil
	return e, added, nil
}

func sizeOf(msgs []*llmv1.Message) int {
	n := 0
	for _, m := range msgs {
		n += proto.Size(m)
	}
	return n
}

// remember keeps req's conversation (prev's messages and added) when the
// caller asked for it, and returns the entry (nil when not remembered).
func (s *Service) remember(req *llmv1.GenerateRequest, prev *prefix.Entry, added []*llmv1.Message) *prefix.Entry {
	if !req.GetRememberPrefix() || s.prefixes == nil {
		return nil
	}
	ref := req.GetPrefix()
	e, err := s.prefixes.Put(req.GetTenant(), prev, prefix.Request{Messages: req.GetMessages(), Added: added, System: req.System, Tools: req.GetTools(),
		SameSystem: ref.GetSameSystem(), SameTools: ref.GetSameTools()})
	if err != nil {
		s.log.Warn("generate: conversation not remembered", "err", err)
		return nil
	}
	return e
}

// bodySlot is the provider.BodyCache of one request: the body kept beside
// the conversation it continues, and the entry that remembers its own.
type bodySlot struct {
	c          *prefix.Cache
	prev, next *prefix.Entry
}

func (b bodySlot) Prev() *provider.BodyPrefix {
	if b.prev == nil {
		return nil
	}
	return b.c.Body(b.prev)
}

func (b bodySlot) Keep(p *provider.BodyPrefix) {
	if b.next != nil {
		b.c.SetBody(b.next, p)
	}
}

// PrefixStats reports the remembered-conversation cache's hits, misses and
// evictions, and how many conversations it holds.
func (s *Service) PrefixStats() (prefix.Stats, int) {
	if s.prefixes == nil {
		return prefix.Stats{}, 0
	}
	return s.prefixes.Stats(), s.prefixes.Len()
}
