package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/services/agent/internal/approval"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// Domain errors of the service.
var (
	// ErrSessionNotFound: no live or stored session has the id.
	ErrSessionNotFound = errors.New("session not found")
	// ErrClosing: the service is shutting down and admits no new work.
	ErrClosing = errors.New("agent service is shutting down")
)

// InvalidError is bad client input; its message says what to fix.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

// Code is the stable error code.
func (e *InvalidError) Code() string { return "INVALID_ARGUMENT" }

func invalidf(format string, args ...any) error {
	return &InvalidError{Msg: fmt.Sprintf(format, args...)}
}

// toStatus is the one table from domain errors to gRPC status codes.
// Unmapped errors become Internal with a generic message; the full error is
// logged.
func toStatus(log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var inv *InvalidError
	var full *loop.QueueFullError
	var badAnswer *approval.InvalidAnswerError
	var elsewhere *cluster.OwnedElsewhereError
	switch {
	case errors.As(err, &elsewhere):
		return elsewhere.Status().Err() // the Forwarder reads its ErrorInfo
	case errors.As(err, &full):
		return status.Error(codes.ResourceExhausted, full.Error())
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, inv.Msg)
	case errors.As(err, &badAnswer):
		return status.Error(codes.InvalidArgument, badAnswer.Msg)
	case errors.Is(err, approval.ErrUnknownRequest):
		return status.Error(codes.NotFound, err.Error()+": the id must be a PendingRequest.id of this session")
	case errors.Is(err, approval.ErrSettled):
		return status.Error(codes.FailedPrecondition, err.Error()+": the first answer, a cancel or the deadline settled it")
	case errors.Is(err, ErrSessionNotFound), errors.Is(err, persistence.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, loop.ErrDisposed):
		return status.Error(codes.FailedPrecondition, "session is disposed: "+err.Error())
	case errors.Is(err, persistence.ErrExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, persistence.ErrFenced):
		return status.Error(codes.Unavailable, "the session moved to another replica; retry: "+err.Error())
	case errors.Is(err, ErrClosing):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	log.Error("internal error", "method", method, "err", err)
	return status.Error(codes.Internal, "internal error")
}

// existsErr is the error of a session id that is already live, worded as
// the stores word one already stored: CreateSession's answer must not tell
// a session in this replica's memory from one that is not.
func existsErr(id string) error { return fmt.Errorf("session %q: %w", id, persistence.ErrExists) }
