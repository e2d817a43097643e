package agent

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// TestUsageSumFoldsIncrementally: sums folded a few events at a time equal
// the sums over the whole log, and a returned sum is the caller's copy.
func TestUsageSumFoldsIncrementally(t *testing.T) {
	t.Parallel()
	am := func(in, out int64, cacheRead *int64) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantMessage{AssistantMessage: &sessionv1.AssistantMessage{
			Usage: &llmv1.TokenUsage{InputTokens: in, OutputTokens: out, CacheReadTokens: cacheRead}}}}
	}
	end := func(in int64) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SubagentEnd{SubagentEnd: &sessionv1.SubagentEnd{Usage: &llmv1.TokenUsage{InputTokens: in, ReasoningTokens: proto.Int64(2)}}}}
	}
	evs := []*sessionv1.SessionEvent{am(10, 1, nil), {Payload: &sessionv1.SessionEvent_StepEnd{StepEnd: &sessionv1.StepEnd{}}}, end(5), am(20, 2, proto.Int64(7)), end(1), am(1, 1, proto.Int64(1))}
	var whole usageSum
	wantOwn, wantKids := whole.of(evs)
	if wantOwn.GetInputTokens() != 31 || wantOwn.GetCacheReadTokens() != 8 || wantKids.GetInputTokens() != 6 || wantKids.GetReasoningTokens() != 4 {
		t.Fatalf("sums own %v children %v", wantOwn, wantKids)
	}
	var inc usageSum
	var own, kids *llmv1.TokenUsage
	for _, n := range []int{0, 1, 3, 3, 5, 6} {
		own, kids = inc.of(evs[:n])
		own.InputTokens += 1000 // the caller's copy
	}
	own.InputTokens -= 1000
	if diff := cmp.Diff(wantOwn, own, protocmp.Transform()); diff != "" {
		t.Fatalf("own usage (-whole +incremental):\n%s", diff)
	}
	if diff := cmp.Diff(wantKids, kids, protocmp.Transform()); diff != "" {
		t.Fatalf("children usage (-whole +incremental):\n%s", diff)
	}
}
