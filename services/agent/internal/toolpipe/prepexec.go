package toolpipe

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// A batch of one call to a remote host is prepared and executed on one
// ToolHost.PrepareExecute stream instead of a PrepareCalls call and an
// Execute stream: PrepareCalls opens the stream and sends prepare, takes the
// host's prepared answer as its own, and parks the stream (pending) under
// the call's execution; Begin takes it into the Call, and Dispatch sends
// execute on it where it would call Execute (after the checkpoint). Every
// other end of the call releases the stream unsent (release): the host then
// runs nothing and ends the stream OK. A host that answers UNIMPLEMENTED is
// remembered (until it reconnects) and gets PrepareCalls and Execute.

// preparedStream is a PrepareExecute stream whose call is prepared and
// waits for its go-ahead.
type preparedStream struct {
	hs     *hostState
	stream grpc.BidiStreamingClient[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]
	cancel context.CancelFunc // ends the stream CANCELLED; the host then runs nothing
}

// prepareExecute opens a PrepareExecute stream for ex on hs and returns the
// host's PreparedCall, the stream parked for Begin. served is false when
// the host does not serve PrepareExecute (the caller falls back to
// PrepareCalls); pc is nil when it failed otherwise (the caller then uses
// the descriptor's mode, as for a failed PrepareCalls, and Dispatch uses
// Execute).
func (p *Pipeline) prepareExecute(ctx context.Context, hs *hostState, ex *toolsv1.ToolExecution) (pc *toolsv1.PreparedCall, served bool) {
	sctx, cancel := context.WithCancel(ctx)
	// The prepare is bounded as PrepareCalls is (the stream's set-up, the
	// prepare and its answer); the stream itself lives on until Dispatch
	// or a release.
	timer := time.AfterFunc(p.cfg.StartTimeout, cancel)
	stream, err := hs.host.Client.PrepareExecute(sctx)
	var m *toolsv1.PrepareExecuteResponse
	if err == nil {
		err = stream.Send(&toolsv1.PrepareExecuteRequest{Step: &toolsv1.PrepareExecuteRequest_Prepare{
			Prepare: &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{ex}}}})
		if err == nil || errors.Is(err, io.EOF) { // io.EOF: the stream ended, Recv says why
			m, err = stream.Recv()
		}
	}
	if !timer.Stop() && err == nil {
		err = status.Error(codes.DeadlineExceeded, "no prepared answer in time")
	}
	if err != nil {
		cancel()
		if status.Code(err) == codes.Unimplemented {
			hs.noPrepareExecute.Store(true)
			p.log.Debug("toolhost does not serve PrepareExecute; using PrepareCalls and Execute", "host", hs.host.Name)
			return nil, false
		}
		p.log.Debug("prepare execute failed; using descriptor modes", "host", hs.host.Name, "err", err)
		return nil, true
	}
	calls := m.GetPrepared().GetCalls()
	if len(calls) != 1 {
		cancel()
		p.log.Debug("prepare execute answered no single prepared call; using descriptor modes", "host", hs.host.Name, "calls", len(calls))
		return nil, true
	}
	p.pendMu.Lock()
	if p.pending == nil {
		p.pending = map[*toolsv1.ToolExecution]*preparedStream{}
	}
	if old := p.pending[ex]; old != nil {
		// The same execution prepared twice: the last one counts, and
		// the first is released as any call not run is.
		p.release(old)
	}
	p.pending[ex] = &preparedStream{hs: hs, stream: stream, cancel: cancel}
	p.pendMu.Unlock()
	return calls[0], true
}

// take removes and returns the stream prepared for ex, if any.
func (p *Pipeline) take(ex *toolsv1.ToolExecution) *preparedStream {
	p.pendMu.Lock()
	defer p.pendMu.Unlock()
	ps := p.pending[ex]
	if ps != nil {
		delete(p.pending, ex)
	}
	return ps
}

// Release ends the streams PrepareCalls opened for execs that Begin did
// not take (a call never started: a cancelled turn, a failed append, a
// wrapper that answered the call itself). The loop calls it once a batch
// is over; the hosts run none of these calls.
func (p *Pipeline) Release(execs []*toolsv1.ToolExecution) {
	for _, ex := range execs {
		if ps := p.take(ex); ps != nil {
			p.release(ps)
		}
	}
}

// release ends the call's prepared stream unsent, if it still has one.
func (c *Call) release() {
	if c.pre != nil {
		c.p.release(c.pre)
		c.pre = nil
	}
}

// release ends ps unsent without making its caller wait (a release is on
// the turn's path: an approval about to wait for a person, a cancelled
// turn). It closes the send side, which a host takes as "not dispatched":
// it runs nothing and ends the stream OK, so neither side counts a call
// not run by design as CANCELLED. A goroutine reads the stream to its end
// and then cancels its context to free it; the read is bounded by
// StartTimeout and by Close, past which the stream is cancelled. A stream
// whose context has already ended (a cancelled turn) is ending CANCELLED
// anyway, as it should: it is only cancelled.
func (p *Pipeline) release(ps *preparedStream) {
	if ps.stream.Context().Err() != nil {
		ps.cancel()
		return
	}
	p.drainMu.Lock()
	if p.drainClosed {
		p.drainMu.Unlock()
		ps.cancel()
		return
	}
	p.drains.Add(1)
	p.drainMu.Unlock()
	go func() {
		defer p.drains.Done()
		defer ps.cancel()
		timer := time.AfterFunc(p.cfg.StartTimeout, ps.cancel)
		defer timer.Stop()
		stop := context.AfterFunc(p.drainCtx, ps.cancel)
		defer stop()
		if ps.stream.CloseSend() != nil {
			return
		}
		for {
			// io.EOF: the host ended the stream OK; another error: it
			// ended otherwise, or the bound cancelled it.
			if _, err := ps.stream.Recv(); err != nil {
				return
			}
		}
	}()
}

// executePrepared sends the go-ahead on the call's prepared stream and
// reads the call's output and result as execute does. ok is false only when
// the go-ahead could not be sent (the stream had already ended): the host
// ran nothing, and the caller uses Execute instead.
func (c *Call) executePrepared(ctx context.Context, hs *hostState) (res *toolsv1.ToolExecutionResult, ok bool) {
	pre := c.pre
	c.pre = nil
	defer pre.cancel() // releases the stream (and ends its span) however the call ends
	// The stream was opened under PrepareCalls' context; the call's own
	// ends it too, as it would end an Execute stream.
	stop := context.AfterFunc(ctx, pre.cancel)
	defer stop()
	if err := pre.stream.Send(&toolsv1.PrepareExecuteRequest{Step: &toolsv1.PrepareExecuteRequest_Execute{
		Execute: &toolsv1.ExecuteRequest{Execution: c.ex}}}); err != nil {
		return nil, false
	}
	// The execute is sent: from here the host may run the call, so it is
	// never run again with Execute. A failed close shows in the read.
	_ = pre.stream.CloseSend()
	return c.readStream(ctx, hs, func() (*toolsv1.ExecuteResponse, error) {
		m, err := pre.stream.Recv()
		if err != nil {
			return nil, err
		}
		// A message that is not an event (a second prepared) carries
		// neither output nor result: the checker refuses it.
		if ev := m.GetEvent(); ev != nil {
			return ev, nil
		}
		return &toolsv1.ExecuteResponse{}, nil
	}), true
}
