package toolsdk

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// ExecuteSender sends one call's Execute messages: an Execute stream, or a
// PrepareExecute stream's events.
type ExecuteSender interface {
	Send(*toolsv1.ExecuteResponse) error
}

// ServePrepareExecute runs a PrepareExecute stream's message order with a
// host's own PrepareCalls and Execute: prepare (exactly one execution) →
// prepare's answer as prepared → execute and the close of the client's
// send side → execute, whose messages go out as the stream's events. A
// client that closes after prepared, or cancels, runs nothing; a message out
// of order is INVALID_ARGUMENT and a client's cancel passes through as
// received. Host.PrepareExecute is this with Host's PrepareCalls and Execute.
func ServePrepareExecute(
	stream grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse],
	prepare func(context.Context, *toolsv1.PrepareCallsRequest) (*toolsv1.PrepareCallsResponse, error),
	execute func(context.Context, *toolsv1.ExecuteRequest, ExecuteSender) error,
) error {
	msg, err := stream.Recv()
	switch {
	case errors.Is(err, io.EOF):
		return status.Error(codes.InvalidArgument, "PrepareExecute: the stream closed before its prepare message: send prepare with exactly one execution first")
	case err != nil:
		return err
	case msg.GetPrepare() == nil:
		return status.Error(codes.InvalidArgument, "PrepareExecute: the first message must be prepare (with exactly one execution)")
	case len(msg.GetPrepare().GetExecutions()) != 1:
		return status.Errorf(codes.InvalidArgument, "PrepareExecute: prepare carries %d executions; it must carry exactly one (use PrepareCalls for a batch)", len(msg.GetPrepare().GetExecutions()))
	}
	prepared, err := prepare(stream.Context(), msg.GetPrepare())
	if err != nil {
		return err
	}
	if err := stream.Send(&toolsv1.PrepareExecuteResponse{Step: &toolsv1.PrepareExecuteResponse_Prepared{Prepared: prepared}}); err != nil {
		return err
	}
	msg, err = stream.Recv()
	switch {
	case errors.Is(err, io.EOF):
		return nil // not dispatched: the call ends without running
	case err != nil:
		return err
	case msg.GetPrepare() != nil:
		return status.Error(codes.InvalidArgument, "PrepareExecute: a second prepare; after prepared send execute (or close the stream to drop the call)")
	case msg.GetExecute() == nil:
		return status.Error(codes.InvalidArgument, "PrepareExecute: the message after prepared must be execute (or close the stream to drop the call)")
	}
	switch _, err := stream.Recv(); {
	case err == nil:
		return status.Error(codes.InvalidArgument, "PrepareExecute: a message after execute; close the send side after execute")
	case !errors.Is(err, io.EOF):
		return err
	}
	return execute(stream.Context(), msg.GetExecute(), prepareExecuteEvents{stream})
}

// prepareExecuteEvents sends Execute messages as a PrepareExecute stream's
// events.
type prepareExecuteEvents struct {
	stream grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]
}

func (e prepareExecuteEvents) Send(r *toolsv1.ExecuteResponse) error {
	return e.stream.Send(&toolsv1.PrepareExecuteResponse{Step: &toolsv1.PrepareExecuteResponse_Event{Event: r}})
}
