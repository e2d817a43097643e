package toolpipe_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

// recordPrepareExecute is a server option that sends the status each
// PrepareExecute handler returned (what the server's RPC metrics record)
// on ch.
func recordPrepareExecute(ch chan<- codes.Code) grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		if info.FullMethod == toolsv1.ToolHost_PrepareExecute_FullMethodName {
			ch <- status.Code(err)
		}
		return err
	})
}

// askingGate asks a person about calls whose arguments are {"ask":true}:
// it calls waiting, and the person refuses. Every other call is allowed.
type askingGate struct{}

func (askingGate) Approve(_ context.Context, ex *toolsv1.ToolExecution, _ *toolsv1.PreAsk, _ string, waiting func()) (bool, string) {
	if ex.GetArguments() != `{"ask":true}` {
		return true, ""
	}
	if waiting != nil {
		waiting()
	}
	return false, "a person refused"
}

// TestReleasedStreamEndsOK: every way a prepared call ends without being
// sent ends its PrepareExecute stream OK on the host (the client closed
// its send side: the call is simply not run), not CANCELLED, and the body
// never runs; only a turn already cancelled ends it CANCELLED.
func TestReleasedStreamEndsOK(t *testing.T) {
	t.Parallel()
	ended := make(chan codes.Code, 16)
	host := fakes.NewToolHost(fakes.Tool{Name: "echo"})
	addr := fakes.ServeWith(t, []grpc.ServerOption{recordPrepareExecute(ended)}, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, addr)}},
		Gates: func(string) toolpipe.Gate { return askingGate{} },
		Guards: []toolpipe.Guard{func(ex *toolsv1.ToolExecution) string {
			if ex.GetArguments() == `{"forbidden":true}` {
				return "guarded"
			}
			return ""
		}}})
	dispatch := func(ctx context.Context, ex *toolsv1.ToolExecution, checkpoint func(context.Context) error) {
		c := p.Begin(ctx, nil, ex)
		c.Dispatch(ctx, checkpoint)
		c.Finish(ctx)
	}
	// prepareDispatch prepares ex and dispatches it: the guard or the gate
	// (by its arguments) stops it.
	prepareDispatch := func(ctx context.Context, _ context.CancelFunc, ex *toolsv1.ToolExecution) {
		p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
		dispatch(ctx, ex, nil)
	}
	cases := []struct {
		name, args string
		// run prepares ex (under ctx, cancelled by cancel) and ends it
		// without sending it.
		run  func(ctx context.Context, cancel context.CancelFunc, ex *toolsv1.ToolExecution)
		want []codes.Code // the statuses of the streams the host ended
	}{
		{"never begun (Release)", `{}`, func(ctx context.Context, _ context.CancelFunc, ex *toolsv1.ToolExecution) {
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			p.Release([]*toolsv1.ToolExecution{ex})
		}, []codes.Code{codes.OK}},
		{"finished without dispatch", `{}`, func(ctx context.Context, _ context.CancelFunc, ex *toolsv1.ToolExecution) {
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			p.Begin(ctx, nil, ex).Finish(ctx)
		}, []codes.Code{codes.OK}},
		{"denied by a guard", `{"forbidden":true}`, prepareDispatch, []codes.Code{codes.OK}},
		{"checkpoint failed", `{}`, func(ctx context.Context, _ context.CancelFunc, ex *toolsv1.ToolExecution) {
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			dispatch(ctx, ex, func(context.Context) error { return errors.New("disk full") })
		}, []codes.Code{codes.OK}},
		{"approval waits for a person (refused)", `{"ask":true}`, prepareDispatch, []codes.Code{codes.OK}},
		{"prepared twice, then released", `{}`, func(ctx context.Context, _ context.CancelFunc, ex *toolsv1.ToolExecution) {
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			p.Release([]*toolsv1.ToolExecution{ex})
		}, []codes.Code{codes.OK, codes.OK}},
		{"turn cancelled, then released", `{}`, func(ctx context.Context, cancel context.CancelFunc, ex *toolsv1.ToolExecution) {
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			cancel()
			p.Release([]*toolsv1.ToolExecution{ex})
		}, []codes.Code{codes.Canceled}},
		{"turn cancelled before dispatch", `{}`, func(ctx context.Context, cancel context.CancelFunc, ex *toolsv1.ToolExecution) {
			p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
			c := p.Begin(ctx, nil, ex)
			cancel()
			c.Dispatch(ctx, nil)
			c.Finish(ctx)
		}, []codes.Code{codes.Canceled}},
	}
	// One at a time: each case reads the statuses of its own streams.
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ex := &toolsv1.ToolExecution{CallId: tc.name, Name: "echo", Arguments: tc.args, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
			before := host.Counts().PrepareExecute
			tc.run(ctx, cancel, ex)
			if n := host.Counts().PrepareExecute - before; n != len(tc.want) {
				t.Fatalf("%d PrepareExecute streams opened, want %d", n, len(tc.want))
			}
			var got []codes.Code
			timeout := time.After(10 * time.Second)
			for len(got) < len(tc.want) {
				select {
				case c := <-ended:
					got = append(got, c)
				case <-timeout:
					t.Fatalf("the host ended %v of %d streams in 10 s", got, len(tc.want))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("the host ended the released streams %v, want %v", got, tc.want)
			}
			if slices.Contains(host.Executed(), ex.GetCallId()) {
				t.Error("the body ran")
			}
		})
	}
}

// parkedStream is what a neverEndingHost saw on one stream.
type parkedStream struct {
	recvErr error         // what Recv after prepared returned
	ended   chan struct{} // closed once the stream's context ended
	endedAt time.Time     // when it ended (read after ended is closed)
}

// neverEndingHost answers prepared and then never ends the stream itself:
// it waits for the stream's context to end (a client's cancel).
type neverEndingHost struct {
	*fakes.ToolHost
	streams chan *parkedStream
}

func (h neverEndingHost) PrepareExecute(s grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	prepared, _ := h.PrepareCalls(s.Context(), m.GetPrepare())
	if err := s.Send(&toolsv1.PrepareExecuteResponse{Step: &toolsv1.PrepareExecuteResponse_Prepared{Prepared: prepared}}); err != nil {
		return err
	}
	ps := &parkedStream{ended: make(chan struct{})}
	_, ps.recvErr = s.Recv()
	h.streams <- ps
	<-s.Context().Done()
	ps.endedAt = time.Now()
	close(ps.ended)
	return s.Context().Err()
}

// TestReleaseOfAHostThatNeverEnds: a release closes the stream's send side
// without waiting (the host sees the close, not a cancel), and when the
// host does not end the stream the agent cancels it: after the bound
// (StartTimeout), at once when the turn is cancelled, and at Close; no
// goroutine outlives it. Not parallel: it counts goroutines.
func TestReleaseOfAHostThatNeverEnds(t *testing.T) {
	const short, long = 2 * time.Second, time.Minute
	cases := []struct {
		name         string
		bound        time.Duration // the pipeline's StartTimeout
		cancelBefore bool          // the turn is cancelled before the release
		after        func(p *toolpipe.Pipeline, cancel context.CancelFunc)
		wantClose    bool          // the host sees the close of the send side
		min, max     time.Duration // from the release to the stream's end
	}{
		{"cancelled after the bound", short, false, func(*toolpipe.Pipeline, context.CancelFunc) {}, true, short, short + 10*time.Second},
		{"turn cancelled while draining", long, false, func(_ *toolpipe.Pipeline, cancel context.CancelFunc) { cancel() }, true, 0, 10 * time.Second},
		{"pipeline closed while draining", long, false, func(p *toolpipe.Pipeline, _ context.CancelFunc) { p.Close() }, true, 0, 10 * time.Second},
		{"turn already cancelled", long, true, func(*toolpipe.Pipeline, context.CancelFunc) {}, false, 0, 10 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host := neverEndingHost{fakes.NewToolHost(fakes.Tool{Name: "echo"}), make(chan *parkedStream, 2)}
			addr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
			p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, addr)}}, StartTimeout: tc.bound})
			next := func() *parkedStream {
				t.Helper()
				select {
				case ps := <-host.streams:
					return ps
				case <-time.After(10 * time.Second):
					t.Fatal("the host saw no end of the stream's send side in 10 s")
					return nil
				}
			}
			// release prepares a call under ctx, cancels the turn first
			// when asked, releases it and returns when the release did.
			release := func(ctx context.Context, cancel context.CancelFunc, id string, cancelBefore bool) time.Time {
				ex := &toolsv1.ToolExecution{CallId: id, Name: "echo", Arguments: `{}`, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
				p.PrepareCalls(ctx, nil, []*toolsv1.ToolExecution{ex})
				at := time.Now() // a cancel ends the stream from here
				if cancelBefore {
					cancel()
				}
				p.Release([]*toolsv1.ToolExecution{ex})
				return at
			}
			// A first stream, prepared and cancelled with its turn, makes
			// the connection's goroutines; the count after it is the one
			// to come back to.
			wctx, wcancel := context.WithCancel(t.Context())
			release(wctx, wcancel, "warm", true)
			<-next().ended
			time.Sleep(100 * time.Millisecond)
			base := runtime.NumGoroutine()

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			released := release(ctx, cancel, "c1", tc.cancelBefore)
			ps := next()
			select {
			case <-ps.ended:
				if !tc.cancelBefore {
					t.Error("the stream ended before the release's goroutine let it go")
				}
			default:
			}
			if tc.wantClose != errors.Is(ps.recvErr, io.EOF) {
				t.Errorf("after prepared the host read %v; want the close of the send side (io.EOF): %v", ps.recvErr, tc.wantClose)
			}
			tc.after(p, cancel)
			select {
			case <-ps.ended:
			case <-time.After(tc.max + time.Second):
				t.Fatalf("the host's stream was not ended %v after the release", tc.max+time.Second)
			}
			if d := ps.endedAt.Sub(released); d < tc.min*9/10 || d > tc.max {
				t.Errorf("the host's stream ended %v after the release; want %v to %v", d, tc.min, tc.max)
			}
			deadline := time.Now().Add(10 * time.Second)
			for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > base {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines 10 s after the stream ended, %d before the release:\n%s", n, base, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}
