package main

import (
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// warmFirstTurn sets up protobuf's per-type state (each message type's
// coders, built on its first marshal, and its file's full descriptor) for
// the messages every first turn exchanges: the CLI's CreateSession, Send and
// StreamEvents, the session's first events and the first model request.
// That set-up is paid once per process, and otherwise on the path to the
// first model request after the agent serves (issue 19; ~7 % of a launch's
// CPU, docs/arch/throughput.md §17); startStack calls this while it waits
// for the agent, when the CLI has nothing else to do. It warms only types
// the first turn uses anyway, so it adds no work.
func warmFirstTurn() {
	text := textPrompt(" ")
	src := session.UserSource()
	opts := &sessionv1.SessionOptions{ApprovalRules: []*sessionv1.ApprovalRule{{}}}
	tools := []*llmv1.ToolSchema{{}}
	msgs := []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: text}}
	for _, m := range []proto.Message{
		&agentv1.CreateSessionRequest{Options: opts},
		&agentv1.Session{Header: &sessionv1.SessionHeader{Options: opts}, EffectiveOptions: opts, Usage: &llmv1.TokenUsage{}, ChildrenUsage: &llmv1.TokenUsage{}},
		&agentv1.SendRequest{Content: text},
		&agentv1.StreamEventsRequest{},
		&agentv1.StreamEventsResponse{Event: session.TurnStartEvent(1, session.MessageTrigger(src))},
		&agentv1.StreamEventsResponse{Event: session.UserMessageEvent(text, src)},
		&agentv1.StreamEventsResponse{Event: session.StepStartEvent(1, 1)},
		&agentv1.StreamEventsResponse{Event: &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{
			Header: &sessionv1.EpochHeader{Config: &llmv1.LlmCallConfig{}, Tools: tools, MessagePrefix: msgs}}}}},
		&llmv1.GenerateRequest{Messages: msgs, Tools: tools},
	} {
		proto.Size(m)
	}
}
