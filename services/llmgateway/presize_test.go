package llmgateway

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/dsh-dev/dsh/internal/stackgrow"
)

// TestPresizeStreamPassesThrough: the stack presize interceptor hands the
// handler the very server and stream it got, and returns the handler's
// answer unchanged, called from a goroutine with a fresh (2 KiB) stack as
// from one that already grew; a handler's panic reaches the caller.
func TestPresizeStreamPassesThrough(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	presize := presizeStream(stackgrow.NewRunners(2, time.Minute))
	var ss grpc.ServerStream = &countingStream{}
	for _, want := range []error{nil, boom} {
		for _, fresh := range []bool{true, false} {
			run := func() error {
				return presize("srv", ss, &grpc.StreamServerInfo{FullMethod: "/dsh.llm.v1.LlmGateway/Generate"}, func(srv any, got grpc.ServerStream) error {
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
	func() {
		defer func() {
			if p, ok := recover().(*stackgrow.Panic); !ok || p.Value != boom {
				t.Errorf("recovered %v, want the handler's panic", p)
			}
		}()
		_ = presize("srv", ss, &grpc.StreamServerInfo{}, func(any, grpc.ServerStream) error { panic(boom) })
		t.Error("a handler's panic returned")
	}()
}
