// Package toolhostconformance is the protocol suite every dsh toolhost must
// pass, whatever language it is written in: run it against a live host's
// address from a Go test (the Python and TypeScript SDK hosts included).
//
// It checks the contract the agent relies on: descriptors carry valid JSON
// Schema objects; WatchTools starts with the ListTools snapshot; PrepareCalls
// answers one entry per call in order; Execute of an unknown tool is an
// UNKNOWN_TOOL result; a request without a cwd or with a relative one is
// INVALID_ARGUMENT; every Execute stream ends with exactly one result and
// nothing after it; non-object arguments to a validating tool are an
// INVALID_ARGS result. A host that serves PrepareExecute answers prepared
// with PrepareCalls' answer and then exactly one result, ends a stream the
// client closes after prepared with OK, and refuses a message out of order
// with INVALID_ARGUMENT; a host that answers it UNIMPLEMENTED passes (the
// agent falls back to PrepareCalls and Execute).
package toolhostconformance

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Run runs the suite against a host. cwd is an absolute directory the host
// accepts as a session's working directory.
func Run(t *testing.T, c toolsv1.ToolHostClient, cwd string) {
	t.Helper()
	ctx := t.Context()
	list, err := c.ListTools(ctx, &toolsv1.ListToolsRequest{})
	if err != nil {
		t.Fatalf("ListTools: %v", err)
	}
	if len(list.GetTools()) == 0 {
		t.Fatal("ListTools: a host serves at least one tool")
	}
	seen := map[string]bool{}
	for _, d := range list.GetTools() {
		name := d.GetSchema().GetName()
		if name == "" || seen[name] {
			t.Errorf("tool name %q is empty or duplicated", name)
		}
		seen[name] = true
		var schema struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(d.GetSchema().GetParameters()), &schema); err != nil || schema.Type != "object" {
			t.Errorf("tool %s: parameters must be a JSON Schema object, got %q", name, d.GetSchema().GetParameters())
		}
		if d.GetTimeoutMs() < 0 {
			t.Errorf("tool %s: negative timeout", name)
		}
	}

	t.Run("WatchToolsStartsWithTheCurrentSet", func(t *testing.T) {
		st, err := c.WatchTools(ctx, &toolsv1.WatchToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		first, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if first.GetRevision() < list.GetRevision() || len(first.GetTools()) != len(list.GetTools()) {
			t.Errorf("first snapshot rev %d with %d tools; ListTools said rev %d with %d", first.GetRevision(), len(first.GetTools()), list.GetRevision(), len(list.GetTools()))
		}
	})

	first := list.GetTools()[0].GetSchema().GetName()
	t.Run("PrepareCallsAnswersInOrder", func(t *testing.T) {
		resp, err := c.PrepareCalls(ctx, &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{
			{CallId: "a", Name: first, Arguments: "{}"},
			{CallId: "b", Name: "no-such-tool-for-conformance", Arguments: "{}"},
			{CallId: "c", Name: first, Arguments: "not json"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, pc := range resp.GetCalls() {
			ids = append(ids, pc.GetCallId())
		}
		if len(ids) != 3 || ids[0] != "a" || ids[1] != "b" || ids[2] != "c" {
			t.Errorf("call ids %v, want [a b c]", ids)
		}
		if len(ids) == 3 && resp.GetCalls()[1].GetMode() == toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL {
			t.Error("an unknown tool must not be parallel")
		}
	})

	execute := func(ex *toolsv1.ToolExecution) (*toolsv1.ToolExecutionResult, error) {
		st, err := c.Execute(ctx, &toolsv1.ExecuteRequest{Execution: ex})
		if err != nil {
			return nil, err
		}
		var res *toolsv1.ToolExecutionResult
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				if res == nil {
					return nil, errors.New("stream ended without a result")
				}
				return res, nil
			}
			if err != nil {
				return nil, err
			}
			if res != nil {
				return nil, errors.New("message after the result")
			}
			switch m.GetEvent().(type) {
			case *toolsv1.ExecuteResponse_Result:
				res = m.GetResult()
			case *toolsv1.ExecuteResponse_Output:
			default:
				return nil, errors.New("empty ExecuteResponse")
			}
		}
	}
	tc := &toolsv1.ToolContext{SessionId: "conformance", Cwd: cwd}

	t.Run("UnknownToolIsAResult", func(t *testing.T) {
		res, err := execute(&toolsv1.ToolExecution{CallId: "u", Name: "no-such-tool-for-conformance", Arguments: "{}", Context: tc})
		if err != nil {
			t.Fatal(err)
		}
		if !res.GetIsError() || res.GetError().GetCode() != "UNKNOWN_TOOL" {
			t.Errorf("got %v, want an UNKNOWN_TOOL error result", res)
		}
	})

	t.Run("MalformedRequestsAreInvalidArgument", func(t *testing.T) {
		for name, ex := range map[string]*toolsv1.ToolExecution{
			"no context":    {CallId: "m", Name: first, Arguments: "{}"},
			"no cwd":        {CallId: "m", Name: first, Arguments: "{}", Context: &toolsv1.ToolContext{SessionId: "conformance"}},
			"relative cwd":  {CallId: "m", Name: first, Arguments: "{}", Context: &toolsv1.ToolContext{SessionId: "conformance", Cwd: "relative/dir"}},
			"relative root": {CallId: "m", Name: first, Arguments: "{}", Context: &toolsv1.ToolContext{SessionId: "conformance", Cwd: cwd, WorkspaceRoot: "ws"}},
		} {
			if _, err := execute(ex); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: got %v, want INVALID_ARGUMENT", name, err)
			}
		}
	})

	t.Run("PrepareExecute", func(t *testing.T) { prepareExecute(t, c, first, tc) })

	for _, d := range list.GetTools() {
		if !d.GetValidatesArguments() {
			continue
		}
		t.Run("NonObjectArgumentsAreInvalidArgs/"+d.GetSchema().GetName(), func(t *testing.T) {
			for _, args := range []string{"[]", `"x"`, "not json"} {
				res, err := execute(&toolsv1.ToolExecution{CallId: "v", Name: d.GetSchema().GetName(), Arguments: args, Context: tc})
				if err != nil {
					t.Fatal(err)
				}
				if !res.GetIsError() || res.GetError().GetCode() != "INVALID_ARGS" {
					t.Errorf("arguments %s: got %v, want an INVALID_ARGS result", args, res)
				}
			}
		})
		break
	}
}

// Prepare is a PrepareExecute stream's prepare message for exs (the
// protocol wants exactly one; tests of its refusals send others).
func Prepare(exs ...*toolsv1.ToolExecution) *toolsv1.PrepareExecuteRequest {
	return &toolsv1.PrepareExecuteRequest{Step: &toolsv1.PrepareExecuteRequest_Prepare{Prepare: &toolsv1.PrepareCallsRequest{Executions: exs}}}
}

// Execute is a PrepareExecute stream's execute message for ex.
func Execute(ex *toolsv1.ToolExecution) *toolsv1.PrepareExecuteRequest {
	return &toolsv1.PrepareExecuteRequest{Step: &toolsv1.PrepareExecuteRequest_Execute{Execute: &toolsv1.ExecuteRequest{Execution: ex}}}
}

// Exchange sends msgs on one PrepareExecute stream, closes its send side
// and returns what the host sent and how the stream ended (nil for OK).
func Exchange(ctx context.Context, c toolsv1.ToolHostClient, msgs ...*toolsv1.PrepareExecuteRequest) ([]*toolsv1.PrepareExecuteResponse, error) {
	st, err := c.PrepareExecute(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if st.Send(m) != nil {
			break // the host ended the stream: Recv says why
		}
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	var got []*toolsv1.PrepareExecuteResponse
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, m)
	}
}

// prepareExecute checks the PrepareExecute protocol of a host that serves
// it; UNIMPLEMENTED passes.
func prepareExecute(t *testing.T, c toolsv1.ToolHostClient, first string, tc *toolsv1.ToolContext) {
	ctx := t.Context()
	prepare, execute := Prepare, Execute
	unknown := &toolsv1.ToolExecution{CallId: "pe", Name: "no-such-tool-for-conformance", Arguments: "{}", Context: tc}
	got, err := Exchange(ctx, c, prepare(unknown), execute(unknown))
	if status.Code(err) == codes.Unimplemented {
		t.Log("the host does not serve PrepareExecute (UNIMPLEMENTED): the agent uses PrepareCalls and Execute")
		return
	}
	if err != nil {
		t.Fatalf("PrepareExecute of an unknown tool: %v", err)
	}
	if len(got) != 2 || len(got[0].GetPrepared().GetCalls()) != 1 || got[0].GetPrepared().GetCalls()[0].GetCallId() != "pe" ||
		got[0].GetPrepared().GetCalls()[0].GetMode() == toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL {
		t.Fatalf("PrepareExecute of an unknown tool sent %v; want prepared (call pe, not parallel) and one result", got)
	}
	if res := got[1].GetEvent().GetResult(); !res.GetIsError() || res.GetError().GetCode() != "UNKNOWN_TOOL" {
		t.Errorf("PrepareExecute of an unknown tool: got %v, want an UNKNOWN_TOOL error result", got[1])
	}

	call := &toolsv1.ToolExecution{CallId: "pe", Name: first, Arguments: "{}", Context: tc}
	want, err := c.PrepareCalls(ctx, &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{call}})
	if err != nil {
		t.Fatal(err)
	}
	got, err = Exchange(ctx, c, prepare(call))
	if err != nil || len(got) != 1 || !proto.Equal(got[0].GetPrepared(), want) {
		t.Errorf("PrepareExecute closed after prepared: %v, %v; want OK and only prepared, equal to PrepareCalls' %v", got, err, want)
	}

	for _, tt := range []struct {
		name string
		msgs []*toolsv1.PrepareExecuteRequest
	}{
		{"execute first", []*toolsv1.PrepareExecuteRequest{execute(call)}},
		{"two executions", []*toolsv1.PrepareExecuteRequest{prepare(call, call)}},
		{"a second prepare", []*toolsv1.PrepareExecuteRequest{prepare(call), prepare(call)}},
		{"a malformed execution", []*toolsv1.PrepareExecuteRequest{prepare(call), execute(&toolsv1.ToolExecution{CallId: "pe", Name: first, Arguments: "{}"})}},
	} {
		if _, err := Exchange(ctx, c, tt.msgs...); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want INVALID_ARGUMENT", tt.name, err)
		}
	}
}
