package main

import (
	"fmt"

	"google.golang.org/grpc/status"
)

// rpcError turns a gRPC error into one line naming what failed.
func rpcError(what string, err error) error {
	if st, ok := status.FromError(err); ok {
		return &exitError{code: 1, msg: fmt.Sprintf("%s: %s: %s", what, st.Code(), st.Message())}
	}
	return &exitError{code: 1, msg: fmt.Sprintf("%s: %v", what, err)}
}
