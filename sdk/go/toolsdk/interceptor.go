package toolsdk

import (
	"context"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// PreFunc decides about a call before it runs; a nil decision allows.
type PreFunc func(ctx context.Context, ex *toolsv1.ToolExecution) (*toolsv1.PreToolDecision, error)

// PostFunc decides about a call's outcome; a nil decision accepts it as is.
type PostFunc func(ctx context.Context, ex *toolsv1.ToolExecution, res *toolsv1.ToolExecutionResult) (*toolsv1.PostToolDecision, error)

// Interceptor implements the dsh.tools.v1.ToolInterceptor service from two
// functions; either may be nil (allow, accept). An error from a function
// becomes the RPC's status (the agent's fail-open / fail-closed setting then
// decides); a non-status error is reported as INTERNAL.
type Interceptor struct {
	toolsv1.UnimplementedToolInterceptorServer
	pre  PreFunc
	post PostFunc
}

var _ toolsv1.ToolInterceptorServer = (*Interceptor)(nil)

// NewInterceptor builds an interceptor from its two decisions.
func NewInterceptor(pre PreFunc, post PostFunc) *Interceptor {
	return &Interceptor{pre: pre, post: post}
}

// Register registers the interceptor on a gRPC server.
func (i *Interceptor) Register(gs grpc.ServiceRegistrar) {
	toolsv1.RegisterToolInterceptorServer(gs, i)
}

// PreExecute answers allow / deny / ask.
func (i *Interceptor) PreExecute(ctx context.Context, req *toolsv1.PreExecuteRequest) (*toolsv1.PreExecuteResponse, error) {
	if i.pre == nil {
		return &toolsv1.PreExecuteResponse{Decision: Allow()}, nil
	}
	d, err := i.pre(ctx, req.GetExecution())
	if err != nil {
		return nil, asStatus(err)
	}
	if d == nil {
		d = Allow()
	}
	return &toolsv1.PreExecuteResponse{Decision: d}, nil
}

// PostExecute answers accept / block.
func (i *Interceptor) PostExecute(ctx context.Context, req *toolsv1.PostExecuteRequest) (*toolsv1.PostExecuteResponse, error) {
	if i.post == nil {
		return &toolsv1.PostExecuteResponse{Decision: Accept()}, nil
	}
	d, err := i.post(ctx, req.GetExecution(), req.GetResult())
	if err != nil {
		return nil, asStatus(err)
	}
	if d == nil {
		d = Accept()
	}
	return &toolsv1.PostExecuteResponse{Decision: d}, nil
}

func asStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, "interceptor failed")
}

// Allow lets a call proceed.
func Allow() *toolsv1.PreToolDecision {
	return &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Allow{Allow: &toolsv1.PreAllow{}}}
}

// Deny refuses a call; the model sees "Error: <reason>".
func Deny(reason string) *toolsv1.PreToolDecision {
	return &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Deny{Deny: &toolsv1.PreDeny{Reason: reason}}}
}

// Ask asks a human to approve a call.
func Ask(reason string) *toolsv1.PreToolDecision {
	return &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Ask{Ask: &toolsv1.PreAsk{Reason: reason}}}
}

// Accept keeps an outcome unchanged.
func Accept() *toolsv1.PostToolDecision {
	return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Accept{Accept: &toolsv1.PostAccept{}}}
}

// Block turns an outcome into an error carrying feedback for the model.
func Block(feedback string) *toolsv1.PostToolDecision {
	return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Block{Block: &toolsv1.PostBlock{
		Feedback: []*llmv1.ContentBlock{TextBlock(feedback)},
	}}}
}
