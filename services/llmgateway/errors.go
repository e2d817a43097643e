package llmgateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// UnknownRouteError reports a provider route that is not registered.
type UnknownRouteError struct {
	Route      string
	Registered []string
}

func (e *UnknownRouteError) Error() string {
	return fmt.Sprintf("no provider route %q is registered (registered: %v)", e.Route, e.Registered)
}

// Code is the stable error code.
func (e *UnknownRouteError) Code() string { return "NO_ADAPTER" }

// toStatus is the one table from domain errors to gRPC status codes. Only
// requests that are themselves wrong get an error status; an unmapped error
// becomes Internal with a generic message, and is logged in full.
func toStatus(log *slog.Logger, method string, err error) error {
	var (
		reqErr   *provider.RequestError
		routeErr *UnknownRouteError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &reqErr):
		return status.Error(codes.InvalidArgument, reqErr.Error())
	case errors.As(err, &routeErr):
		return status.Error(codes.NotFound, routeErr.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	log.Error("llmgateway: unmapped error", "method", method, "err", err)
	return status.Error(codes.Internal, "internal error")
}
