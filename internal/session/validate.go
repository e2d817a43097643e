package session

import (
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// jsonFields are the string fields that carry raw lossless JSON and must hold
// valid JSON when set. Tool-call arguments are deliberately absent: they are
// the model's raw text and need not be JSON.
var jsonFields = map[protoreflect.FullName]bool{
	"dsh.llm.v1.Extension.json":                   true,
	"dsh.llm.v1.AssistantProvenance.replay_state": true,
	"dsh.llm.v1.ToolSchema.parameters":            true,
	"dsh.llm.v1.FinishChunk.replay_state":         true,
	"dsh.session.v1.ContextMessage.meta":          true,
	"dsh.session.v1.ToolResult.meta":              true,
	"dsh.session.v1.PromptPrefixContext.meta":     true,
}

const extensionName protoreflect.FullName = "dsh.llm.v1.Extension"

// ValidateEvent applies to one event the rules that depend on it alone, the
// ones [Log.Append] applies before looking at the log: a payload is set,
// plugin types are well-formed, surface fields appear only (and properly) on
// surface events, source_event_seqs are earlier than the event's seq, the
// historical-data requirements of §3.7 hold, every string is valid UTF-8 and
// every raw-JSON field (an extension's json, replay states, tool parameter
// schemas, the meta fields) holds valid JSON. It returns an
// [*InvariantError] naming the event's seq, its type and the broken rule, or
// nil. Stores use it to refuse an event they could not load back.
func ValidateEvent(ev *sessionv1.SessionEvent) error {
	if rule := checkPayload(ev); rule != "" {
		return &InvariantError{Seq: ev.GetSeq(), Type: TypeName(ev), Rule: rule}
	}
	return nil
}

// checkPayload applies the rules that depend on the event alone (see
// checkShape and checkContent). It returns the broken rule or "".
func checkPayload(ev *sessionv1.SessionEvent) string {
	if r := checkShape(ev); r != "" {
		return r
	}
	return checkContent(ev)
}

// checkContent checks what does not depend on the event's seq or on the
// log: every string is valid UTF-8 and every raw-JSON field holds valid
// JSON. It is the costly part of validation, so Append runs it before
// taking the log's lock.
func checkContent(ev *sessionv1.SessionEvent) string {
	if rule, ok := checkDeltaChunk(ev); ok {
		return rule
	}
	return checkEvent(ev)
}

// checkShape checks that a payload is set, plugin types are well-formed,
// surface fields appear only (and properly) on surface events, and the
// historical-data requirements of §3.7 hold. It returns the broken rule or
// "".
func checkShape(ev *sessionv1.SessionEvent) string {
	if ev.GetPayload() == nil {
		return "the event has no payload"
	}
	if ext := ev.GetExtension(); ext != nil {
		switch {
		case ext.GetType() == "":
			return "a plugin event needs a non-empty type"
		case coreTypes[ext.GetType()]:
			return fmt.Sprintf("plugin event type %q is reserved for a core event (or a rejected legacy one)", ext.GetType())
		}
	}
	surface := IsSurfaceEvent(ev)
	if !surface {
		if ev.GetSurfaceOp() != nil {
			return "surface_op is only allowed on surface events"
		}
		if ev.GetSourceEventSeqs() != nil {
			return "source_event_seqs is only allowed on surface events"
		}
	} else {
		op := ev.GetSurfaceOp()
		switch o := op.GetOp().(type) {
		case *sessionv1.SurfaceOp_Append:
		case *sessionv1.SurfaceOp_Replace:
			if o.Replace.GetStart() < 0 || o.Replace.GetEnd() < 0 {
				return "a replace range must use non-negative seqs"
			}
		default:
			return "a surface event needs a surface_op (append or replace)"
		}
		if src := ev.GetSourceEventSeqs(); src != nil {
			if len(src.GetSeqs()) == 0 && ev.GetAssistantMessage() == nil {
				return "source_event_seqs may be empty only on assistant/message"
			}
			seen := make(map[int64]bool, len(src.GetSeqs()))
			for _, s := range src.GetSeqs() {
				switch {
				case s < 0:
					return fmt.Sprintf("source_event_seqs holds negative seq %d", s)
				case s >= ev.GetSeq():
					return fmt.Sprintf("source_event_seqs holds seq %d, not strictly earlier than the event", s)
				case seen[s]:
					return fmt.Sprintf("source_event_seqs holds seq %d twice", s)
				}
				seen[s] = true
			}
		}
	}
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_RequestHeader:
		h := p.RequestHeader.GetHeader()
		if h.GetConfig().GetProvider() == "" || h.GetConfig().GetModel() == "" {
			return "a request header needs config.provider and config.model"
		}
		if p.RequestHeader.GetReason() == sessionv1.HeaderReason_HEADER_REASON_UNSPECIFIED {
			return "a request header needs a reason (initial, resume or change)"
		}
	case *sessionv1.SessionEvent_AssistantMessage:
		pv := p.AssistantMessage.GetProvenance()
		if pv.GetProvider() == "" || pv.GetModel() == "" {
			return "an assistant message needs provenance.provider and provenance.model"
		}
	}
	return ""
}

// checkStrings walks every populated field: strings must be valid UTF-8 and
// raw-JSON fields valid JSON.
func checkStrings(m protoreflect.Message) string {
	var rule string
	if m.Descriptor().FullName() == extensionName {
		if s := m.Interface().(*llmv1.Extension).GetJson(); !json.Valid([]byte(s)) {
			return fmt.Sprintf("%s is not valid JSON (use {} or null for no data)", extensionName+".json")
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && rule == ""; i++ {
				rule = checkValue(fd, l.Get(i))
			}
		case fd.IsMap():
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				rule = checkValue(fd.MapValue(), mv)
				return rule == ""
			})
		default:
			rule = checkValue(fd, v)
		}
		return rule == ""
	})
	return rule
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkStrings(v.Message())
	case protoreflect.StringKind:
		s := v.String()
		if !utf8.ValidString(s) {
			return fmt.Sprintf("%s is not valid UTF-8", fd.FullName())
		}
		if jsonFields[fd.FullName()] && !json.Valid([]byte(s)) {
			return fmt.Sprintf("%s is not valid JSON", fd.FullName())
		}
	}
	return ""
}

// surface is the ordered model-visible projection of a log (§3.5) and,
// when derive is set, the cached derivation of its messages (§3.6).
type surface struct {
	derive bool
	nodes  []int64          // surface seqs, in order
	proj   []*llmv1.Message // per node: its derived message, or nil (derive only)
	msgs   []*llmv1.Message // the non-nil projections in order; replaced, never edited, on replace
	gen    int              // replace generation
	work   int              // events projected so far (derive only): a measure of derivation cost
	// The token meter (derive only, see meter.go): per node its estimate,
	// and their sum.
	tok []int64
	sum int64
}

// checkOp checks a surface event's op against the current surface. events
// holds every earlier event (events[s] has seq s). It returns the broken rule
// or "".
func (s *surface) checkOp(ev *sessionv1.SessionEvent, events []*sessionv1.SessionEvent) string {
	r := ev.GetSurfaceOp().GetReplace()
	if r == nil {
		return ""
	}
	i, j := s.index(r.GetStart()), s.index(r.GetEnd())
	switch {
	case i < 0:
		return fmt.Sprintf("replace start %d is not on the surface", r.GetStart())
	case j < 0:
		return fmt.Sprintf("replace end %d is not on the surface", r.GetEnd())
	case i > j:
		return fmt.Sprintf("replace start %d comes after end %d on the surface", r.GetStart(), r.GetEnd())
	}
	var src []int64
	if ev.GetSourceEventSeqs() != nil {
		src = ev.GetSourceEventSeqs().GetSeqs()
	}
	for _, shadowed := range s.nodes[i : j+1] {
		if !slices.Contains(src, shadowed) {
			return fmt.Sprintf("replace must list shadowed seq %d in source_event_seqs", shadowed)
		}
	}
	if tr := ev.GetToolResult(); tr != nil {
		if i != j {
			return "a replacing tool/result must shadow exactly one node"
		}
		old := events[s.nodes[i]].GetToolResult()
		if old == nil {
			return fmt.Sprintf("a replacing tool/result must shadow a tool/result, not %s", TypeName(events[s.nodes[i]]))
		}
		a, b := proto.CloneOf(old), proto.CloneOf(tr)
		a.Content, b.Content = nil, nil
		if !proto.Equal(a, b) {
			return "a replacing tool/result may differ from the shadowed one only in content"
		}
	}
	return ""
}

func (s *surface) index(seq int64) int {
	// Replacements are rare and surfaces short next to logs; a scan from
	// the end finds recent targets (compaction, pruning) quickly.
	for i := len(s.nodes) - 1; i >= 0; i-- {
		if s.nodes[i] == seq {
			return i
		}
	}
	return -1
}

// apply adds a surface event whose op was checked (or, leniently, skips an
// op that does not fit the surface). Appends are O(1) amortised; a replace
// rebuilds the derived messages.
func (s *surface) apply(ev *sessionv1.SessionEvent) {
	var m *llmv1.Message
	var t int64
	if s.derive {
		m = deriveEventMessage(ev)
		t = EstimateMessage(m)
		s.work++
	}
	r := ev.GetSurfaceOp().GetReplace()
	if r == nil {
		s.nodes = append(s.nodes, ev.GetSeq())
		if s.derive {
			s.proj = append(s.proj, m)
			s.tok = append(s.tok, t)
			s.sum += t
			if m != nil {
				s.msgs = append(s.msgs, m)
			}
		}
		return
	}
	i, j := s.index(r.GetStart()), s.index(r.GetEnd())
	if i < 0 || j < 0 || i > j {
		return
	}
	nodes := make([]int64, 0, len(s.nodes)-(j-i))
	nodes = append(append(append(nodes, s.nodes[:i]...), ev.GetSeq()), s.nodes[j+1:]...)
	s.nodes = nodes
	s.gen++
	if !s.derive {
		return
	}
	proj := make([]*llmv1.Message, 0, len(nodes))
	proj = append(append(append(proj, s.proj[:i]...), m), s.proj[j+1:]...)
	s.proj = proj
	for _, x := range s.tok[i : j+1] {
		s.sum -= x
	}
	s.sum += t
	tok := make([]int64, 0, len(nodes))
	s.tok = append(append(append(tok, s.tok[:i]...), t), s.tok[j+1:]...)
	msgs := make([]*llmv1.Message, 0, len(proj))
	s.work += len(proj)
	for _, p := range proj {
		if p != nil {
			msgs = append(msgs, p)
		}
	}
	s.msgs = msgs
}

// deriveEventMessage projects one surface event to its provider message, or
// nil (§3.6). The message shares the event's content, which is immutable.
func deriveEventMessage(ev *sessionv1.SessionEvent) *llmv1.Message {
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_UserMessage:
		return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: p.UserMessage.GetContent()}
	case *sessionv1.SessionEvent_ContextMessage:
		return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: p.ContextMessage.GetContent()}
	case *sessionv1.SessionEvent_SteeringMessage:
		return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: p.SteeringMessage.GetContent()}
	case *sessionv1.SessionEvent_AssistantMessage:
		if len(p.AssistantMessage.GetContent()) == 0 {
			return nil
		}
		return &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: p.AssistantMessage.GetContent(), Provenance: p.AssistantMessage.GetProvenance()}
	case *sessionv1.SessionEvent_ToolResult:
		// The message, its one block and the block's parts in one
		// allocation: a loaded session keeps one per tool result.
		tr := p.ToolResult
		m := &struct {
			m   llmv1.Message
			arr [1]*llmv1.ContentBlock
			b   llmv1.ContentBlock
			w   llmv1.ContentBlock_ToolResult
			r   llmv1.ToolResultBlock
		}{}
		m.r.ToolCallId, m.r.Content, m.r.IsError = tr.GetCallId(), tr.GetContent(), tr.GetIsError()
		m.w.ToolResult = &m.r
		m.b.Block = &m.w
		m.arr[0] = &m.b
		m.m.Role, m.m.Content = llmv1.Role_ROLE_USER, m.arr[:]
		return &m.m
	}
	return nil
}

// DeriveMessages returns the model history of a log (semantics.md §3.6): the
// surface's nodes in order, each projected to its provider message, skipping
// those that project to nothing. It expects a valid log and skips a replace
// that does not fit the surface. The messages share the events' content; do
// not mutate them.
func DeriveMessages(events []*sessionv1.SessionEvent) []*llmv1.Message {
	s := surface{derive: true}
	for _, ev := range events {
		if IsSurfaceEvent(ev) {
			s.apply(ev)
		}
	}
	if s.msgs == nil {
		return []*llmv1.Message{}
	}
	return s.msgs
}

// DeriveEventMessage returns the provider message one surface event projects
// to, or nil (an empty assistant message, or any non-surface event). The
// message shares the event's content; do not mutate it.
func DeriveEventMessage(ev *sessionv1.SessionEvent) *llmv1.Message { return deriveEventMessage(ev) }
