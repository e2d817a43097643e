package events

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// HeaderOmitted marks a reference message: the event was too large for the
// server's max_payload, so the message carries its headers (type, seq,
// session id, Nats-Msg-Id) and no body, and the header's value is the size of
// the encoded event in bytes. A consumer fetches the event itself from the
// agent: AgentService.StreamEvents{session_id, from_seq: seq, no_follow} and
// take the first event (docs/API.md, "Events on NATS").
const HeaderOmitted = "Dsh-Event-Omitted"

// OmittedError is what DecodeEvent returns for a reference message.
type OmittedError struct {
	SessionID string
	Seq       int64
	Type      string
	Size      int
}

func (e *OmittedError) Error() string {
	return fmt.Sprintf("event %d (%s) of session %s is %d bytes, over the NATS server's max_payload: fetch it with StreamEvents from_seq=%d (dsh sessions events %s)",
		e.Seq, e.Type, e.SessionID, e.Size, e.Seq, e.SessionID)
}

// msgSize is what a message counts against max_payload: headers and data.
func msgSize(m *nats.Msg) int {
	n := len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // "k: v\r\n"
		}
	}
	return n + len("NATS/1.0\r\n\r\n")
}

// fitPayload returns m when it fits in maxPayload (<= 0: no limit), else a
// reference message in its place (same subject and headers, no body,
// HeaderOmitted set) and true.
func fitPayload(m *nats.Msg, maxPayload int64) (*nats.Msg, bool) {
	if maxPayload <= 0 || int64(msgSize(m)) <= maxPayload {
		return m, false
	}
	ref := nats.NewMsg(m.Subject)
	ref.Reply = m.Reply // the window's slot: without it the acknowledgement never comes back
	for k, vs := range m.Header {
		ref.Header[k] = append([]string(nil), vs...)
	}
	ref.Header.Set(HeaderOmitted, strconv.Itoa(len(m.Data)))
	return ref, true
}

// omitted returns the OmittedError of a reference message, or nil.
func omitted(h nats.Header) error {
	v := h.Get(HeaderOmitted)
	if v == "" {
		return nil
	}
	size, _ := strconv.Atoi(v)
	seq, _ := strconv.ParseInt(h.Get(HeaderSeq), 10, 64)
	return &OmittedError{SessionID: h.Get(HeaderSessionID), Seq: seq, Type: h.Get(HeaderEventType), Size: size}
}
