package telemetry

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Attribute keys dsh adds next to the GenAI semantic conventions.
const (
	// SessionIDKey is the session a span or metric belongs to (also sent
	// as gen_ai.conversation.id).
	SessionIDKey = attribute.Key("dsh.session.id")
	// TurnKey is the turn number.
	TurnKey = attribute.Key("dsh.turn")
	// StepKey is the step number within the turn.
	StepKey = attribute.Key("dsh.step")
	// ToolHostKey names the toolhost that executed a tool call.
	ToolHostKey = attribute.Key("dsh.tool.host")
	// ToolIsErrorKey is a tool result's is_error.
	ToolIsErrorKey = attribute.Key("dsh.tool.is_error")
	// TurnEndReasonKey is the turn/end reason ("completed", "error", ...).
	TurnEndReasonKey = attribute.Key("dsh.turn.end_reason")
	// GenAISystemKey is the pre-1.37 name of gen_ai.provider.name, still
	// read by many backends; dsh sends both.
	GenAISystemKey = attribute.Key("gen_ai.system")
)

// Span names. Model and tool spans follow the GenAI conventions
// ("chat {model}", "execute_tool {name}").
const (
	SpanTurn = "dsh.turn"
	SpanStep = "dsh.step"
)

// Tracer is the dsh tracer of the global provider.
func Tracer() trace.Tracer { return otel.Tracer(ScopeName) }

// StartTurn opens a turn span. A turn runs on the session's driver, after
// the Send RPC that queued it has returned, so the turn span is a new root
// (one turn is one trace) linked to the span of the RPC that queued it
// (pass its SpanContext as queuedBy; an invalid one adds no link).
func StartTurn(ctx context.Context, sessionID string, turn int32, queuedBy trace.SpanContext) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			semconv.GenAIOperationNameInvokeAgent,
			semconv.GenAIConversationID(sessionID),
			SessionIDKey.String(sessionID),
			TurnKey.Int(int(turn)),
		),
	}
	if queuedBy.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: queuedBy}))
	}
	return Tracer().Start(ctx, SpanTurn, opts...)
}

// EndTurn records the end reason and ends the span; reason "error" marks the
// span as failed with message.
func EndTurn(span trace.Span, reason, message string) {
	span.SetAttributes(TurnEndReasonKey.String(reason))
	if reason == "error" {
		span.SetStatus(codes.Error, message)
	}
	span.End()
}

// StartStep opens a step span, a child of the turn span in ctx.
func StartStep(ctx context.Context, sessionID string, turn, step int32) (context.Context, trace.Span) {
	return Tracer().Start(ctx, SpanStep, trace.WithAttributes(
		SessionIDKey.String(sessionID), TurnKey.Int(int(turn)), StepKey.Int(int(step)),
	))
}

// StartModelCall opens a model-call span ("chat {model}", kind client), a
// child of the step span in ctx. The gateway's server span joins it through
// otelgrpc.
func StartModelCall(ctx context.Context, sessionID, provider, model string) (context.Context, trace.Span) {
	return Tracer().Start(ctx, "chat "+model,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(ModelCallAttributes(sessionID, provider, model)...))
}

// ModelCallAttributes are the request-side GenAI attributes of a model call.
func ModelCallAttributes(sessionID, provider, model string) []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.GenAIOperationNameChat,
		semconv.GenAIProviderNameKey.String(provider),
		GenAISystemKey.String(provider),
		semconv.GenAIRequestModel(model),
		semconv.GenAIConversationID(sessionID),
	}
}

// EndModelCall records the response-side attributes (usage, finish reason,
// failure) and ends the span. usage and finish may be nil.
func EndModelCall(span trace.Span, model string, usage *llmv1.TokenUsage, finish *llmv1.FinishReason) {
	span.SetAttributes(semconv.GenAIResponseModel(model))
	span.SetAttributes(UsageAttributes(usage)...)
	if finish != nil {
		span.SetAttributes(semconv.GenAIResponseFinishReasons(FinishReasonName(finish)))
		if f := finish.GetError().GetFailure(); f != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(orDefault(f.GetCode(), "error")))
			span.SetStatus(codes.Error, f.GetMessage())
		}
	}
	span.End()
}

// UsageAttributes are the GenAI usage attributes of u (none when nil).
func UsageAttributes(u *llmv1.TokenUsage) []attribute.KeyValue {
	if u == nil {
		return nil
	}
	attrs := []attribute.KeyValue{
		semconv.GenAIUsageInputTokens(int(u.GetInputTokens())),
		semconv.GenAIUsageOutputTokens(int(u.GetOutputTokens())),
	}
	if u.CacheReadTokens != nil {
		attrs = append(attrs, semconv.GenAIUsageCacheReadInputTokens(int(u.GetCacheReadTokens())))
	}
	if u.CacheWriteTokens != nil {
		attrs = append(attrs, semconv.GenAIUsageCacheCreationInputTokens(int(u.GetCacheWriteTokens())))
	}
	return attrs
}

// FinishReasonName is the GenAI name of a finish reason: stop, tool_calls,
// length, aborted, error, or the extension's type.
func FinishReasonName(f *llmv1.FinishReason) string {
	switch k := f.GetKind().(type) {
	case *llmv1.FinishReason_Stop:
		return "stop"
	case *llmv1.FinishReason_ToolCalls:
		return "tool_calls"
	case *llmv1.FinishReason_MaxTokens:
		return "length"
	case *llmv1.FinishReason_Aborted:
		return "aborted"
	case *llmv1.FinishReason_Error:
		return "error"
	case *llmv1.FinishReason_Extension:
		return k.Extension.GetType()
	default:
		return "unknown"
	}
}

// StartToolCall opens a tool-call span ("execute_tool {name}"), a child of
// the step span in ctx. host names the toolhost that owns the tool.
func StartToolCall(ctx context.Context, sessionID, name, callID, host string) (context.Context, trace.Span) {
	return Tracer().Start(ctx, "execute_tool "+name,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			semconv.GenAIOperationNameExecuteTool,
			semconv.GenAIToolName(name),
			semconv.GenAIToolCallID(callID),
			semconv.GenAIConversationID(sessionID),
			ToolHostKey.String(host),
		))
}

// EndToolCall records is_error (and the error code, when there is one) and
// ends the span.
func EndToolCall(span trace.Span, isError bool, errorCode string) {
	span.SetAttributes(ToolIsErrorKey.Bool(isError))
	if isError {
		span.SetAttributes(semconv.ErrorTypeKey.String(orDefault(errorCode, "tool_error")))
		span.SetStatus(codes.Error, orDefault(errorCode, "tool error"))
	}
	span.End()
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
