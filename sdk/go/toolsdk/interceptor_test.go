package toolsdk_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

func TestInterceptor(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	def := toolsdk.NewInterceptor(nil, nil)
	pre, err := def.PreExecute(ctx, &toolsv1.PreExecuteRequest{})
	if err != nil || pre.GetDecision().GetAllow() == nil {
		t.Errorf("default pre = %v, %v", pre, err)
	}
	post, err := def.PostExecute(ctx, &toolsv1.PostExecuteRequest{})
	if err != nil || post.GetDecision().GetAccept() == nil {
		t.Errorf("default post = %v, %v", post, err)
	}

	i := toolsdk.NewInterceptor(
		func(_ context.Context, ex *toolsv1.ToolExecution) (*toolsv1.PreToolDecision, error) {
			switch ex.GetName() {
			case "deny":
				return toolsdk.Deny("no"), nil
			case "ask":
				return toolsdk.Ask("sure?"), nil
			case "status":
				return nil, status.Error(codes.Unavailable, "policy store down")
			case "plain":
				return nil, errors.New("secret detail")
			}
			return nil, nil
		},
		func(_ context.Context, _ *toolsv1.ToolExecution, r *toolsv1.ToolExecutionResult) (*toolsv1.PostToolDecision, error) {
			if r.GetIsError() {
				return toolsdk.Block("try again"), nil
			}
			return nil, nil
		})
	for name, want := range map[string]*toolsv1.PreToolDecision{"deny": toolsdk.Deny("no"), "ask": toolsdk.Ask("sure?"), "other": toolsdk.Allow()} {
		got, err := i.PreExecute(ctx, &toolsv1.PreExecuteRequest{Execution: &toolsv1.ToolExecution{Name: name}})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got.GetDecision(), protocmp.Transform()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	if _, err := i.PreExecute(ctx, &toolsv1.PreExecuteRequest{Execution: &toolsv1.ToolExecution{Name: "status"}}); status.Code(err) != codes.Unavailable {
		t.Errorf("status error passed as %v", err)
	}
	if _, err := i.PreExecute(ctx, &toolsv1.PreExecuteRequest{Execution: &toolsv1.ToolExecution{Name: "plain"}}); status.Code(err) != codes.Internal || status.Convert(err).Message() == "secret detail" {
		t.Errorf("plain error became %v", err)
	}
	got, err := i.PostExecute(ctx, &toolsv1.PostExecuteRequest{Result: &toolsv1.ToolExecutionResult{IsError: true}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(toolsdk.Block("try again"), got.GetDecision(), protocmp.Transform()); diff != "" {
		t.Errorf("post (-want +got):\n%s", diff)
	}
}
