package llmgateway

import (
	"errors"
	"testing"

	"google.golang.org/grpc"
)

// TestPresizeStreamPassesThrough: the stack presize interceptor hands the
// handler the very server and stream it got, and returns the handler's
// answer unchanged, on a goroutine with a fresh (2 KiB) stack as on one
// that already grew.
func TestPresizeStreamPassesThrough(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	var ss grpc.ServerStream = &countingStream{}
	for _, want := range []error{nil, boom} {
		for _, fresh := range []bool{true, false} {
			run := func() error {
				return presizeStream("srv", ss, &grpc.StreamServerInfo{FullMethod: "/dsh.llm.v1.LlmGateway/Generate"}, func(srv any, got grpc.ServerStream) error {
					if srv != "srv" || got != ss {
						t.Errorf("handler got %v, %v", srv, got)
					}
					return want
				})
			}
			var err error
			if fresh {
				done := make(chan struct{})
				go func() { defer close(done); err = run() }()
				<-done
			} else {
				err = run()
			}
			if !errors.Is(err, want) || (want == nil) != (err == nil) {
				t.Errorf("fresh=%v: got %v, want %v", fresh, err, want)
			}
		}
	}
}
