package loop

import (
	"context"
	"errors"
	"fmt"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/compact"
)

// ContextManager keeps the model context inside its window (the
// compact.Compactor): AfterStep is the pressure trigger, run after each
// successful step before its step/end; Recover runs after a
// CONTEXT_WINDOW_EXCEEDED failure and reports whether the surface changed,
// in which case the loop retries the step once.
type ContextManager interface {
	AfterStep(ctx context.Context, s compact.Session) (*compact.Result, error)
	Recover(ctx context.Context, s compact.Session) (retry bool, err error)
}

// codeContextWindowExceeded is the canonical overflow code.
const codeContextWindowExceeded = "CONTEXT_WINDOW_EXCEEDED"

// maxOverflowRetries bounds the retries of one step after a recovery.
const maxOverflowRetries = 1

// ErrBusy is the error of Exclusive while a turn runs or is queued.
var ErrBusy = errors.New("the session is running a turn; try again when it is idle")

// compactSession is the session as a compaction sees it in turn.
func (a *Agent) compactSession(turn int32) compact.Session {
	return compact.Session{Log: a.log, Append: a.append, Flush: a.flush, Turn: turn}
}

// afterStep runs the pressure trigger; a failed compaction is reported and
// never fails the turn (the next request may still fit, and an overflow
// is recovered then).
func (a *Agent) afterStep(ctx context.Context, turn, step int32) error {
	if a.cfg.Context == nil {
		return nil
	}
	if _, err := a.cfg.Context.AfterStep(ctx, a.compactSession(turn)); err != nil {
		if cerr := checkpoint(ctx); cerr != nil {
			return cerr
		}
		a.reportError(turn, step, fmt.Errorf("compaction after the step: %w", err))
	}
	return nil
}

// recoverOverflow runs overflow recovery; it reports whether to retry.
func (a *Agent) recoverOverflow(ctx context.Context, turn, step int32, retries *int) (bool, error) {
	if a.cfg.Context == nil || *retries >= maxOverflowRetries {
		return false, nil
	}
	retry, err := a.cfg.Context.Recover(ctx, a.compactSession(turn))
	if cerr := checkpoint(ctx); cerr != nil {
		return false, cerr
	}
	if err != nil {
		a.reportError(turn, step, fmt.Errorf("context overflow recovery: %w", err))
	}
	if retry {
		*retries++
	}
	return retry, nil
}

// Exclusive runs fn in a zero-step turn of its own (trigger trigger) while
// the session is idle: no turn starts until it returns, Cancel cancels its
// context like a turn's, and the turn is closed (aborted when cancelled,
// disposed on disposal, completed otherwise) and flushed before Exclusive
// returns. It fails with ErrBusy when a turn runs or is queued.
func (a *Agent) Exclusive(ctx context.Context, trigger *sessionv1.TurnTrigger, fn func(ctx context.Context, s compact.Session) error) error {
	a.mu.Lock()
	// A driver whose turn has ended (turn/end logged, nothing queued) is
	// settling to idle: wait for it rather than answer busy to a caller that
	// saw the turn/end.
	for a.driving && !a.disposed && !a.exclusive && len(a.queued) == 0 && !a.turnOpenLocked() {
		ch := make(chan struct{})
		a.waiters = append(a.waiters, ch)
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		a.mu.Lock()
	}
	if a.disposed {
		a.mu.Unlock()
		return ErrDisposed
	}
	if a.status == agentv1.AgentStatus_AGENT_STATUS_RUNNING || a.exclusive || len(a.queued) > 0 {
		a.mu.Unlock()
		return ErrBusy
	}
	turn := a.lastTurn + 1
	if _, err := a.appendLocked(session.TurnStartEvent(turn, trigger)); err != nil {
		a.mu.Unlock()
		return err
	}
	tctx, cancel := context.WithCancelCause(a.ctx)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	a.exclusive, a.turnCancel = true, cancel
	a.setStatusLocked(agentv1.AgentStatus_AGENT_STATUS_RUNNING)
	a.mu.Unlock()

	err := fn(tctx, a.compactSession(turn))

	stop()
	a.mu.Lock()
	a.turnCancel = nil
	a.mu.Unlock()
	reason := completedReason()
	switch {
	case tctx.Err() != nil && errors.Is(context.Cause(tctx), ErrDisposed):
		reason = &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Disposed{Disposed: &sessionv1.EndDisposed{}}}
	case tctx.Err() != nil:
		reason = &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Aborted{Aborted: &sessionv1.EndAborted{}}}
	}
	cancel(nil)
	_, endErr := a.append(session.TurnEndEvent(turn, reason))
	ferr := a.flush(ctx)
	a.mu.Lock()
	a.exclusive = false
	if len(a.queued) == 0 {
		a.setStatusLocked(agentv1.AgentStatus_AGENT_STATUS_IDLE)
	}
	a.kickLocked()
	a.mu.Unlock()
	if ferr != nil {
		ferr = fmt.Errorf("flush: %w", ferr)
	}
	return errors.Join(err, endErr, ferr)
}

// turnOpenLocked reports whether the log has an open turn.
func (a *Agent) turnOpenLocked() bool {
	_, open := a.log.OpenTurn()
	return open
}
