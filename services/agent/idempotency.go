package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/services/agent/internal/idem"
)

// Idempotent commands (docs/API.md "Retries and request_id"). A command's
// request_id is recorded in the session log (SessionEvent.request_id on the
// event that records it; SessionHeader.request_id for CreateSession), so a
// retry after an agent restart is still recognised; the bounded reply cache
// in front keeps the first reply for retries that arrive while it is hot.

// defaultReplyCache is Config.ReplyCache's default.
const defaultReplyCache = 4096

// maxRequestID bounds a request_id's length in bytes.
const maxRequestID = 128

func checkRequestID(rid string) error {
	if len(rid) > maxRequestID {
		return invalidf("request_id is %d bytes long; the limit is %d", len(rid), maxRequestID)
	}
	for _, r := range rid {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return invalidf("request_id contains a control or invalid character")
		}
	}
	return nil
}

// replyKey scopes a request id to the caller's tenant, the method and the
// session.
func (s *Service) replyKey(ctx context.Context, method, session, rid string) idem.Key {
	return idem.Key{Tenant: auth.TenantOf(principalOf(ctx).Tenant), Method: method, Session: session, RequestID: rid}
}

// once runs a session command with an optional request id: a cached first
// reply answers a retry; otherwise run (whose session dedupes by the id
// recorded in its log) and cache its reply.
func once[R proto.Message](s *Service, ctx context.Context, method, session, rid string, run func() (R, error)) (R, error) {
	if err := checkRequestID(rid); err != nil {
		var zero R
		return zero, err
	}
	if rid == "" {
		return run()
	}
	key := s.replyKey(ctx, method, session, rid)
	if v, ok := s.replies.Get(key); ok {
		if r, ok := v.(R); ok {
			return r, nil
		}
	}
	r, err := run()
	if err == nil {
		s.replies.Put(key, r)
	}
	return r, err
}

// derivedID is the session id of a CreateSession with a request_id and no
// session_id: the same for every retry, different across tenants.
func derivedID(tenant, rid string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + rid))
	return hex.EncodeToString(sum[:12])
}

// createdBy returns session id when it was created by the caller's tenant
// with request id rid: the retry of the request that created it. A stored
// session is vetted by its header first, tenant and request id alike, so
// only that retry loads it (on a replica: claims its lease when nobody
// holds it); another tenant's id, or another request's, is answered
// (false) without touching it. err is set when the retry cannot be
// answered now: the store failed (before any tenant check, so it tells
// nothing), or loading the vetted session failed — among them
// *cluster.OwnedElsewhereError, when another replica owns it: the retry is
// forwarded there, as the create would have been. A retry is never told
// ALREADY_EXISTS for its own session because of a passing failure.
func (s *Service) createdBy(ctx context.Context, id, rid string) (*agentv1.Session, bool, error) {
	if hr, ok := s.deps.Store.(headerReader); ok {
		h, err := hr.ReadHeader(ctx, id)
		switch {
		case errors.Is(err, persistence.ErrNotFound):
			// Created and not stored yet (a lone agent stores at the first
			// append): acquire finds it in memory or not at all.
		case err != nil:
			return nil, false, fmt.Errorf("read session %s: %w", id, err)
		case !s.sameRequest(ctx, h, rid):
			return nil, false, nil
		}
	}
	l, err := s.acquire(ctx, id)
	if errors.Is(err, ErrSessionNotFound) || errors.Is(err, persistence.ErrNotFound) {
		return nil, false, nil // gone, or another tenant's session only in memory
	}
	if err != nil {
		return nil, false, err
	}
	defer s.release(l)
	if !s.sameRequest(ctx, l.log.Header(), rid) {
		return nil, false, nil
	}
	return l.snapshot(), true, nil
}

// sameRequest reports whether h is the header of a session the caller's
// tenant created with request id rid (the tenant itself, not any tenant the
// caller may see: an admin's request ids are its own tenant's).
func (s *Service) sameRequest(ctx context.Context, h *sessionv1.SessionHeader, rid string) bool {
	return h.GetRequestId() == rid && auth.TenantOf(h.GetTenant()) == auth.TenantOf(principalOf(ctx).Tenant)
}
