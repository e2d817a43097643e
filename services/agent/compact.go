package agent

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/compact"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// compactTrigger is the trigger of the zero-step turn of a manual
// compaction of an idle session.
func compactTrigger() *sessionv1.TurnTrigger { return pluginTrigger("compact") }

// newCompactor builds the service's compactor: windows and per-route
// overrides come from the gateway when the LLM seam can report them.
func newCompactor(cfg Config, deps Deps, s *Service) *compact.Compactor {
	if cfg.NoCompaction {
		return nil
	}
	models, _ := deps.LLM.(compact.Models)
	return compact.New(deps.LLM, models, cfg.Compaction, s.log)
}

// contextManager is the loop's view of the compactor (nil when disabled).
func (s *Service) contextManager() loop.ContextManager {
	if s.compactor == nil {
		return nil
	}
	return s.compactor
}

// measurement is the API form of a compactor reading.
func measurement(r compact.Reading) *agentv1.ContextMeasurement {
	out := &agentv1.ContextMeasurement{TotalTokens: r.TotalTokens, Baseline: r.Baseline, LogRevision: r.LogRevision,
		SurfaceNodes: int32(r.SurfaceNodes)}
	if ratio, ok := r.Ratio(); ok {
		out.ContextWindow, out.Ratio = proto.Int64(r.Window), proto.Float64(ratio)
	}
	return out
}

// contextOf measures a live session (the window from the gateway, cached;
// unknown when the gateway does not know it or compaction is off).
func (s *Service) contextOf(ctx context.Context, l *liveSession) *agentv1.ContextMeasurement {
	if s.compactor == nil {
		m := l.log.Measure()
		return measurement(compact.Reading{Measurement: m})
	}
	return measurement(s.compactor.Read(ctx, l.log))
}

// Compact compacts a session's context: the whole eligible range, or the
// given surface span, in a zero-step turn of its own while the session is
// idle.
func (s *Service) Compact(ctx context.Context, req *agentv1.CompactRequest) (*agentv1.CompactResponse, error) {
	if (req.Start == nil) != (req.End == nil) {
		return nil, status.Error(codes.InvalidArgument, "give both start and end (an inclusive span of surface seqs), or neither for the whole eligible range")
	}
	var span *compact.Span
	if req.Start != nil {
		span = &compact.Span{Start: req.GetStart(), End: req.GetEnd()}
	}
	if err := s.admitting(); err != nil {
		return nil, toStatus(s.log, "Compact", err)
	}
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, "Compact", err)
	}
	defer s.release(l)
	if s.compactor == nil {
		return nil, status.Error(codes.FailedPrecondition, "compaction is disabled on this agent")
	}
	if seq, held := l.log.Compacting(); held {
		return nil, status.Errorf(codes.FailedPrecondition, "compact: %v (compact/start at seq %d); wait for its compact/end", compact.ErrInProgress, seq)
	}
	var res *compact.Result
	err = l.agent.Exclusive(ctx, compactTrigger(), func(ctx context.Context, sess compact.Session) error {
		var err error
		res, err = s.compactor.Compact(ctx, sess, span)
		return err
	})
	if err != nil {
		return nil, compactStatus(s, err)
	}
	out := &agentv1.CompactResponse{Pruned: int32(len(res.Pruned)), Context: s.contextOf(ctx, l)}
	if res.EndSeq > 0 {
		out.StartSeq, out.SummarySeq, out.EndSeq, out.Summary = res.StartSeq, res.SummarySeq, res.EndSeq, res.Summary
		out.ShadowedRange = &sessionv1.SurfaceReplace{Start: res.Start, End: res.End}
		out.ShadowedSeqs, out.ShadowedTokenCount = res.ShadowedSeqs, res.ShadowedTokens
	}
	return out, nil
}

// compactStatus maps the errors of a manual compaction.
func compactStatus(s *Service, err error) error {
	var span *compact.SpanError
	var shrink *compact.NotShrinkingError
	switch {
	case errors.Is(err, loop.ErrDisposed), errors.Is(err, ErrSessionNotFound):
		return toStatus(s.log, "Compact", err)
	case errors.As(err, &span):
		return status.Error(codes.InvalidArgument, span.Error())
	case errors.Is(err, loop.ErrBusy):
		return status.Error(codes.FailedPrecondition, "compact: "+err.Error())
	case errors.Is(err, compact.ErrInProgress):
		return status.Error(codes.FailedPrecondition, "compact: "+err.Error()+"; wait for its compact/end")
	case errors.Is(err, compact.ErrNothingToCompact), errors.Is(err, compact.ErrNoRequest):
		return status.Error(codes.FailedPrecondition, "compact: "+err.Error())
	case errors.As(err, &shrink):
		return status.Error(codes.Aborted, "compact: "+err.Error()+"; the context is unchanged")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "compact: "+err.Error())
	}
	var inv *session.AppendError
	if errors.As(err, &inv) {
		return status.Error(codes.Aborted, "compact: the session changed under the compaction: "+err.Error())
	}
	if st, ok := status.FromError(err); !ok || st.Code() == codes.Unknown {
		return status.Error(codes.Aborted, "compact: "+err.Error())
	}
	return toStatus(s.log, "Compact", err)
}
