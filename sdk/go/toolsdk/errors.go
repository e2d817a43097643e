package toolsdk

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus is the one table from the host's request errors to gRPC codes.
// Tool failures never reach it: they are results.
func toStatus(err error) error {
	var re *requestError
	switch {
	case errors.As(err, &re):
		return status.Error(codes.InvalidArgument, re.msg)
	default:
		return status.Error(codes.Internal, "internal error")
	}
}
