package toolsdk_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
)

// countingHost serves a tool "count" that counts its runs.
func countingHost(t *testing.T, cfg toolsdk.HostConfig) (*atomic.Int32, toolsv1.ToolHostClient) {
	t.Helper()
	runs := new(atomic.Int32)
	count := toolsdk.Define("count", "Counts its runs.", func(context.Context, *toolsdk.Call, struct{}) (toolsdk.Result, error) {
		runs.Add(1)
		return toolsdk.Text("ran"), nil
	})
	h, err := toolsdk.NewHost(cfg, count)
	if err != nil {
		t.Fatal(err)
	}
	return runs, startHost(t, h)
}

// TestPrepareExecuteIsPrepareCallsThenExecute: for every kind of call the
// stream answers PrepareCalls' answer and then exactly Execute's messages
// (or Execute's error for a malformed execution).
func TestPrepareExecuteIsPrepareCallsThenExecute(t *testing.T) {
	t.Parallel()
	_, c := newHost(t, toolsdk.HostConfig{MaxArgumentBytes: 64})
	for _, tt := range []struct{ name, tool, args string }{
		{"success with output and views", "echo", `{"text":"hi","repeat":2}`},
		{"not parallel", "echo", `{"text":"hi","shout":true}`},
		{"invalid args", "echo", `{"shout":"yes"}`},
		{"not json", "echo", `{"text":`},
		{"unknown tool", "nope", `{}`},
		{"panic", "boom", `{}`},
		{"typed failure", "fail", `{}`},
		{"raw tool", "raw", `{"q":1}`},
		{"oversized", "echo", `{"text":"` + strings.Repeat("a", 100) + `"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ex := exec(tt.tool, tt.args).GetExecution()
			wantPrep, err := c.PrepareCalls(t.Context(), &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{ex}})
			if err != nil {
				t.Fatal(err)
			}
			wantOuts, wantRes, wantErr := collect(t.Context(), t, c, &toolsv1.ExecuteRequest{Execution: ex})
			got, err := toolhostconformance.Exchange(t.Context(), c, toolhostconformance.Prepare(ex), toolhostconformance.Execute(ex))
			if status.Code(err) != status.Code(wantErr) || status.Convert(err).Message() != status.Convert(wantErr).Message() {
				t.Fatalf("PrepareExecute ended with %v; Execute with %v", err, wantErr)
			}
			if len(got) == 0 {
				t.Fatal("no prepared message")
			}
			if diff := cmp.Diff(wantPrep, got[0].GetPrepared(), protocmp.Transform()); diff != "" {
				t.Errorf("prepared (-PrepareCalls +PrepareExecute):\n%s", diff)
			}
			want := []*toolsv1.ExecuteResponse{}
			for _, o := range wantOuts {
				want = append(want, &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Output{Output: o}})
			}
			if wantRes != nil {
				want = append(want, &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Result{Result: wantRes}})
			}
			events := []*toolsv1.ExecuteResponse{}
			for _, m := range got[1:] {
				if m.GetEvent() == nil {
					t.Fatalf("a message after prepared that is not an event: %v", m)
				}
				events = append(events, m.GetEvent())
			}
			if diff := cmp.Diff(want, events, protocmp.Transform()); diff != "" {
				t.Errorf("events (-Execute +PrepareExecute):\n%s", diff)
			}
		})
	}
}

// TestPrepareExecuteProtocolErrors: a message out of order is
// INVALID_ARGUMENT with a message naming the rule, and no body runs.
func TestPrepareExecuteProtocolErrors(t *testing.T) {
	t.Parallel()
	runs, c := countingHost(t, toolsdk.HostConfig{})
	ex := exec("count", `{}`).GetExecution()
	for _, tt := range []struct {
		name     string
		msgs     []*toolsv1.PrepareExecuteRequest
		prepared bool
		msg      string
	}{
		{"nothing", nil, false, "closed before its prepare message"},
		{"execute first", []*toolsv1.PrepareExecuteRequest{toolhostconformance.Execute(ex)}, false, "first message must be prepare"},
		{"an empty message first", []*toolsv1.PrepareExecuteRequest{{}}, false, "first message must be prepare"},
		{"prepare without executions", []*toolsv1.PrepareExecuteRequest{toolhostconformance.Prepare()}, false, "prepare carries 0 executions"},
		{"prepare with two executions", []*toolsv1.PrepareExecuteRequest{toolhostconformance.Prepare(ex, ex)}, false, "prepare carries 2 executions"},
		{"a second prepare", []*toolsv1.PrepareExecuteRequest{toolhostconformance.Prepare(ex), toolhostconformance.Prepare(ex)}, true, "a second prepare"},
		{"a message after execute", []*toolsv1.PrepareExecuteRequest{toolhostconformance.Prepare(ex), toolhostconformance.Execute(ex), toolhostconformance.Execute(ex)}, true, "a message after execute"},
		{"a malformed execution", []*toolsv1.PrepareExecuteRequest{toolhostconformance.Prepare(ex), toolhostconformance.Execute(&toolsv1.ToolExecution{Name: "count", Arguments: "{}"})}, true, "execution.context.cwd is required"},
	} {
		got, err := toolhostconformance.Exchange(t.Context(), c, tt.msgs...)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT containing %q", tt.name, err, tt.msg)
		}
		if n := len(got); tt.prepared && (n != 1 || got[0].GetPrepared() == nil) || !tt.prepared && n != 0 {
			t.Errorf("%s: host sent %v; want prepared only: %v", tt.name, got, tt.prepared)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("the body ran %d times on refused streams", n)
	}
}

// executeSignal is a server stream that signals on got when it has read an
// execute message.
type executeSignal struct {
	grpc.ServerStream
	got chan<- struct{}
}

func (s executeSignal) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if r, ok := m.(*toolsv1.PrepareExecuteRequest); ok && err == nil && r.GetExecute() != nil {
		s.got <- struct{}{}
	}
	return err
}

// TestPrepareExecuteRunsNothingWithoutTheGoAhead: a client that does not
// dispatch (it closes after prepared, cancels after prepared, or sends
// execute but cancels before closing its send side) never runs the body.
// Each case waits until the host's handler has returned, so a run would
// have been counted.
func TestPrepareExecuteRunsNothingWithoutTheGoAhead(t *testing.T) {
	t.Parallel()
	ended, gotExecute := make(chan error, 1), make(chan struct{}, 1)
	runs, c := countingHost(t, toolsdk.HostConfig{ServerOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(
		func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			err := handler(srv, executeSignal{ss, gotExecute})
			if info.FullMethod == toolsv1.ToolHost_PrepareExecute_FullMethodName {
				ended <- err
			}
			return err
		})}})
	ex := exec("count", `{}`).GetExecution()
	for _, tt := range []struct {
		name    string
		execute bool // send execute before ending
		cancel  bool // cancel instead of closing the send side
		code    codes.Code
		runs    int32
	}{
		{"closed after prepared", false, false, codes.OK, 0},
		{"cancelled after prepared", false, true, codes.Canceled, 0},
		{"execute sent, cancelled before the close", true, true, codes.Canceled, 0},
		{"execute sent and closed (control)", true, false, codes.OK, 1},
	} {
		ctx, cancel := context.WithCancel(t.Context())
		st, err := c.PrepareExecute(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(toolhostconformance.Prepare(ex)); err != nil {
			t.Fatal(err)
		}
		if m, err := st.Recv(); err != nil || m.GetPrepared() == nil {
			t.Fatalf("%s: prepared: %v %v", tt.name, m, err)
		}
		if tt.execute {
			if err := st.Send(toolhostconformance.Execute(ex)); err != nil {
				t.Fatal(err)
			}
			// The host has read execute: a cancel now is one after the
			// go-ahead's message, before its close.
			select {
			case <-gotExecute:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the host did not read execute", tt.name)
			}
		}
		if tt.cancel {
			cancel()
		} else if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-ended:
			if status.Code(err) != tt.code {
				t.Errorf("%s: the handler ended with %v, want %s", tt.name, err, tt.code)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the handler did not end", tt.name)
		}
		cancel()
		if n := runs.Load(); n != tt.runs {
			t.Errorf("%s: the body has run %d times, want %d", tt.name, n, tt.runs)
		}
	}
}
