package agent

import (
	"context"
	"errors"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/persistence"
)

// storedLengther is implemented by stores that tell a session's stored log
// length without reading the log (sqlitestore).
type storedLengther interface {
	StoredLength(ctx context.Context, id string) (int64, error)
}

// peekStored answers GetSession for a session that is not in memory from
// the store's header and stored length — status UNLOADED, header, next_seq;
// what only the log tells (title, usage, effective options, pending
// requests, context) stays empty until a command loads it — without loading
// its log (issue 19). ok is false when the session is live, unknown to the
// store, or the store cannot read a header and length without reading the
// log (the PostgreSQL and JSONL stores): the caller acquires it as before.
func (s *Service) peekStored(ctx context.Context, id string) (_ *agentv1.Session, ok bool, _ error) {
	hr, can := s.deps.Store.(headerReader)
	sl, canLen := s.deps.Store.(storedLengther)
	if !can || !canLen || id == "" {
		return nil, false, nil
	}
	s.mu.Lock()
	_, live := s.live[id]
	s.mu.Unlock()
	if live {
		return nil, false, nil
	}
	h, err := hr.ReadHeader(ctx, id)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, true, err
	case !principalOf(ctx).CanSee(h.GetTenant()):
		return nil, true, notFound(id)
	}
	n, err := sl.StoredLength(ctx, id)
	if err != nil {
		return nil, false, nil // e.g. gone since: acquire gives the answer
	}
	h.Tenant = auth.TenantOf(h.GetTenant()) // as load does
	return &agentv1.Session{Header: h, Status: agentv1.AgentStatus_AGENT_STATUS_UNLOADED, NextSeq: n}, true, nil
}
