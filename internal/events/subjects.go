package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// StreamName is the JetStream stream that holds every session event.
const StreamName = "DSH_EVENTS"

// Subject prefixes. Every subject dsh publishes is built by the functions
// below and nowhere else.
const (
	eventsPrefix = "dsh.events."
	statusPrefix = "dsh.status."
)

// DefaultTenant is the tenant of a session whose header names none (the
// agent with --auth none).
const DefaultTenant = "default"

// Wildcards that match every session of every tenant.
const (
	// AllEvents matches the event subject of every session; it is also the
	// subject filter of the stream.
	AllEvents = eventsPrefix + ">"
	// AllStatus matches the status subject of every session.
	AllStatus = statusPrefix + ">"
)

// Header names carried by every event message (and, for the session id,
// tenant and status, by every status message).
const (
	HeaderEventType = "Dsh-Event-Type"
	HeaderSeq       = "Dsh-Seq"
	HeaderSessionID = "Dsh-Session-Id"
	// HeaderTenant carries TenantToken(tenant): printable ASCII, so a
	// tenant name cannot break the header block.
	HeaderTenant = "Dsh-Tenant"
	HeaderStatus = "Dsh-Status"
	// HeaderDelta is "1" on delta events (assistant/chunk: streamed pieces
	// of the assistant/message that follows), absent on all others, so a
	// consumer that wants only whole events skips them by header, before
	// decoding anything.
	HeaderDelta = "Dsh-Delta"
)

// IsDelta reports whether an event is a delta (HeaderDelta).
// storeMarshal encodes an event as the stores do (deterministically), so a
// published message is byte for byte the stored row's event.
var storeMarshal = proto.MarshalOptions{Deterministic: true}

func IsDelta(ev *sessionv1.SessionEvent) bool { return ev.GetAssistantChunk() != nil }

// EventSubject is the JetStream subject of a session's events,
// dsh.events.<tenant>.<session>, where tenant is TenantToken(tenant) and
// session is SubjectToken(sessionID). Both are always exactly one subject
// token, so a tenant's consumer can be scoped with dsh.events.<tenant>.>.
func EventSubject(tenant, sessionID string) string {
	return eventsPrefix + TenantToken(tenant) + "." + SubjectToken(sessionID)
}

// StatusSubject is the core-NATS subject of a session's status changes,
// dsh.status.<tenant>.<session>.
func StatusSubject(tenant, sessionID string) string {
	return statusPrefix + TenantToken(tenant) + "." + SubjectToken(sessionID)
}

// TenantEvents matches the event subjects of every session of one tenant.
func TenantEvents(tenant string) string { return eventsPrefix + TenantToken(tenant) + ".>" }

// TenantStatus matches the status subjects of every session of one tenant.
func TenantStatus(tenant string) string { return statusPrefix + TenantToken(tenant) + ".>" }

// SessionEvents matches the event subject of one session whatever its
// tenant (for a reader that knows the id but not the tenant).
func SessionEvents(sessionID string) string { return eventsPrefix + "*." + SubjectToken(sessionID) }

// SessionStatus matches the status subject of one session whatever its
// tenant.
func SessionStatus(sessionID string) string { return statusPrefix + "*." + SubjectToken(sessionID) }

// TenantInboxPrefix is the reply-inbox prefix a tenant's consumer uses, so
// that NATS permissions can let it subscribe to its own replies
// (_INBOX_<tenant>.>) and nobody else's.
func TenantInboxPrefix(tenant string) string { return "_INBOX_" + TenantToken(tenant) }

// AgentPermissions are the NATS permissions the agent's user needs: publish
// events and status (dsh.>), use the JetStream API (create and widen the
// stream, read a session's last message), and receive its replies.
func AgentPermissions() (publish, subscribe []string) {
	return []string{"dsh.>", "$JS.API.>"}, []string{"_INBOX.>"}
}

// ConsumerPermissions are the NATS permissions a consumer of one tenant
// needs, and all it needs: publish to create consumers filtered to the
// tenant's events (the create subject carries the filter), pull from and
// delete them; subscribe to the tenant's events and status and to its own
// reply inboxes (TenantInboxPrefix). deploy/k8s's nats.conf and the tests
// grant exactly these.
func ConsumerPermissions(tenant string) (publish, subscribe []string) {
	return []string{
			"$JS.API.CONSUMER.CREATE." + StreamName + ".*." + TenantEvents(tenant),
			"$JS.API.CONSUMER.MSG.NEXT." + StreamName + ".*",
			"$JS.API.CONSUMER.DELETE." + StreamName + ".*",
		}, []string{
			TenantEvents(tenant), TenantStatus(tenant), TenantInboxPrefix(tenant) + ".>",
		}
}

// TenantToken is the subject token of a tenant: DefaultTenant for "", else
// SubjectToken(tenant). The encoding is injective and never yields '.', '*'
// or '>', so no tenant name can widen a subject, span two tokens or collide
// with another tenant's ("a.b" is "a%2Eb", "*" is "%2A"). Tenants made of
// letters, digits, '-' and '_' appear unchanged, which is what operators
// write in NATS permissions.
func TenantToken(tenant string) string {
	if tenant == "" {
		return DefaultTenant
	}
	return SubjectToken(tenant)
}

// MsgID is the Nats-Msg-Id of an event, <session_id>:<seq>; JetStream drops
// a second message with the same id inside the stream's duplicate window.
func MsgID(sessionID string, seq int64) string {
	return sessionID + ":" + strconv.FormatInt(seq, 10)
}

// SubjectToken makes a session id a single NATS subject token. Ids made of
// letters, digits, '-', '_' and other printable ASCII pass unchanged; '.',
// '*', '>', '%', spaces and any other byte outside '!'..'~' become %XX, so
// the mapping is injective and DecodeSubjectToken reverses it.
func SubjectToken(sessionID string) string {
	if sessionID != "" && !needsEscape(sessionID) {
		return sessionID
	}
	var b strings.Builder
	for i := 0; i < len(sessionID); i++ {
		c := sessionID[i]
		if escapeByte(c) {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	if b.Len() == 0 {
		return "%" // the empty id; never minted, but keep the subject valid
	}
	return b.String()
}

// DecodeSubjectToken reverses SubjectToken.
func DecodeSubjectToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '%' {
			b.WriteByte(tok[i])
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("events: bad escape in subject token %q", tok)
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("events: bad escape in subject token %q", tok)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

func needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		if escapeByte(s[i]) {
			return true
		}
	}
	return false
}

func escapeByte(c byte) bool {
	return c <= ' ' || c > '~' || c == '.' || c == '*' || c == '>' || c == '%'
}

// EncodeEvent builds the JetStream message of one event: the protobuf
// encoding of the SessionEvent as payload, the type, seq, session id and
// tenant headers (and Dsh-Delta on a delta), and the Nats-Msg-Id used for
// de-duplication.
func EncodeEvent(tenant, sessionID string, ev *sessionv1.SessionEvent) (*nats.Msg, error) {
	data, err := storeMarshal.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s seq %d: %w", sessionID, ev.GetSeq(), err)
	}
	b := newMsgBuilder(false) // the caller owns the message: nothing shared
	return b.build(EventSubject(tenant, sessionID), "", TenantToken(tenant), sessionID, ev, data), nil
}

// build makes the builder's message the JetStream message of an event
// whose protobuf encoding is data, on subject (EventSubject) with tenantTok
// (TenantToken) and the reply subject reply: the type, seq, session id and
// tenant headers, Dsh-Delta on a delta, and the Nats-Msg-Id used for
// de-duplication. The message is the builder's until the next build.
func (b *msgBuilder) build(subject, reply, tenantTok, sessionID string, ev *sessionv1.SessionEvent, data []byte) *nats.Msg {
	id := MsgID(sessionID, ev.GetSeq())
	b.typ[0], b.seq[0], b.sid[0], b.tenant[0], b.id[0] = session.TypeName(ev), id[len(sessionID)+1:], sessionID, tenantTok, id
	if IsDelta(ev) {
		b.msg.Header[HeaderDelta] = b.delta
	} else {
		delete(b.msg.Header, HeaderDelta)
	}
	b.msg.Subject, b.msg.Reply, b.msg.Data = subject, reply, data
	return &b.msg
}

// DecodeEvent reads an event message: its session id (from the header) and
// the event. A reference message (an event over the server's max_payload)
// returns the id and an *OmittedError saying how to fetch the event.
func DecodeEvent(h nats.Header, data []byte) (string, *sessionv1.SessionEvent, error) {
	id := h.Get(HeaderSessionID)
	if id == "" {
		return "", nil, errors.New("events: message has no " + HeaderSessionID + " header")
	}
	if err := omitted(h); err != nil {
		return id, nil, err
	}
	ev := &sessionv1.SessionEvent{}
	if err := proto.Unmarshal(data, ev); err != nil {
		return "", nil, fmt.Errorf("events: decode event of %s: %w", id, err)
	}
	return id, ev, nil
}

// EncodeStatus builds the core-NATS message of a status change. The payload
// is the status's enum name (for example AGENT_STATUS_IDLE), also in the
// Dsh-Status header.
func EncodeStatus(tenant, sessionID string, st agentv1.AgentStatus) *nats.Msg {
	m := nats.NewMsg(StatusSubject(tenant, sessionID))
	m.Data = []byte(st.String())
	m.Header.Set(HeaderSessionID, sessionID)
	m.Header.Set(HeaderTenant, TenantToken(tenant))
	m.Header.Set(HeaderStatus, st.String())
	return m
}

// DecodeStatus reads a status message.
func DecodeStatus(h nats.Header, data []byte) (string, agentv1.AgentStatus, error) {
	v, ok := agentv1.AgentStatus_value[string(data)]
	if !ok {
		return "", 0, fmt.Errorf("events: unknown status %q", data)
	}
	return h.Get(HeaderSessionID), agentv1.AgentStatus(v), nil
}
