package agent

import (
	"context"
	"time"
)

// Drop removes a session from memory at once, whatever it is doing: its
// turn is stopped, its queued prompts are dropped (logged) and its
// StreamEvents followers end with UNAVAILABLE (they call again and reach
// the new owner). A replica
// calls it when it lost the session's lease (cluster.Config.OnLost):
// another replica owns the log now, this one's appends are fenced, and the
// next request for the session claims or forwards it again. It reports
// whether the session was live.
func (s *Service) Drop(ctx context.Context, id string) bool {
	s.mu.Lock()
	l, ok := s.live[id]
	if ok {
		delete(s.live, id)
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	close(l.dropped) // its followers end now (StreamEvents)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	s.log.Warn("dropping a session owned by another replica now", "session", l.id, "unflushed", l.log.Len()-l.durableSeq())
	s.retire(ctx, l)
	return true
}

// Adopt makes a stored session live on this service (on a replica: claims
// its lease and loads it, the store's repair closing a turn a dead owner
// left open). A replica's sweep calls it for orphaned sessions.
func (s *Service) Adopt(ctx context.Context, id string) error {
	l, err := s.acquireAny(ctx, id)
	if err != nil {
		return err
	}
	s.release(l)
	return nil
}
