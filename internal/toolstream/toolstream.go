// Package toolstream checks the ToolHost Execute stream contract from the
// caller's side: zero or more ToolOutput messages, then exactly one
// well-formed ToolExecutionResult, then nothing. A stream that breaks it is a
// *ProtocolError (code TOOL_HOST_PROTOCOL_ERROR) for that one call; the
// connection to the host stays usable. The agent's tool pipeline, the
// cross-language conformance suite and the MCP bridge tests share it.
package toolstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"google.golang.org/grpc"
)

// CodeProtocolError is the stable code of a call whose host broke the Execute
// stream contract.
const CodeProtocolError = "TOOL_HOST_PROTOCOL_ERROR"

// ProtocolError reports a host that broke the Execute stream contract: no
// result, two results, a message after the result, an empty message, or a
// result whose content is not valid tool-result blocks. It fails that one
// call; the connection to the host stays usable.
type ProtocolError struct {
	// Reason says what was wrong, for a person.
	Reason string
}

func (e *ProtocolError) Error() string { return "tool host protocol error: " + e.Reason }

// Code returns TOOL_HOST_PROTOCOL_ERROR.
func (e *ProtocolError) Code() string { return CodeProtocolError }

// ErrorName is the error class carried on the result.
func (e *ProtocolError) ErrorName() string { return "ToolHostProtocolError" }

func protocolErr(format string, args ...any) error {
	return &ProtocolError{Reason: fmt.Sprintf(format, args...)}
}

// ProtocolErrorResult is the model-facing result for a call whose stream was
// malformed: "Error: tool host protocol error: <reason>", is_error, with
// {ToolHostProtocolError, TOOL_HOST_PROTOCOL_ERROR}.
func ProtocolErrorResult(err *ProtocolError) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{
		Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "Error: " + err.Error()}}}},
		IsError: true,
		Error:   &toolsv1.ToolErrorInfo{Name: err.ErrorName(), Code: err.Code()},
	}
}

// StreamChecker classifies an Execute stream message by message, so a caller
// can forward outputs live and still reject a malformed stream. The zero
// value is ready.
type StreamChecker struct {
	n      int
	result *toolsv1.ToolExecutionResult
}

// Push checks the next message. It returns the output to forward (nil for
// the result) or a *ProtocolError.
func (c *StreamChecker) Push(m *toolsv1.ExecuteResponse) (*toolsv1.ToolOutput, error) {
	c.n++
	if c.result != nil {
		if m.GetResult() != nil {
			return nil, protocolErr("the stream carried a second result (message %d)", c.n)
		}
		return nil, protocolErr("message %d came after the result", c.n)
	}
	switch ev := m.GetEvent().(type) {
	case *toolsv1.ExecuteResponse_Output:
		if ev.Output == nil {
			return nil, protocolErr("message %d is an empty output", c.n)
		}
		return ev.Output, nil
	case *toolsv1.ExecuteResponse_Result:
		if ev.Result == nil {
			return nil, protocolErr("message %d is an empty result", c.n)
		}
		if err := CheckResult(ev.Result); err != nil {
			return nil, err
		}
		c.result = ev.Result
		return nil, nil
	default:
		return nil, protocolErr("message %d carries neither output nor result", c.n)
	}
}

// End reports the result once the stream has ended cleanly, or a
// *ProtocolError when it ended without one.
func (c *StreamChecker) End() (*toolsv1.ToolExecutionResult, error) {
	if c.result == nil {
		return nil, protocolErr("the stream ended without a result after %d messages", c.n)
	}
	return c.result, nil
}

// CheckExecuteStream classifies a complete Execute stream: zero or more
// outputs, then exactly one valid result, then nothing. It returns the
// result and the outputs, or a *ProtocolError.
func CheckExecuteStream(msgs []*toolsv1.ExecuteResponse) (*toolsv1.ToolExecutionResult, []*toolsv1.ToolOutput, error) {
	var c StreamChecker
	var outs []*toolsv1.ToolOutput
	for _, m := range msgs {
		o, err := c.Push(m)
		if err != nil {
			return nil, nil, err
		}
		if o != nil {
			outs = append(outs, o)
		}
	}
	r, err := c.End()
	if err != nil {
		return nil, nil, err
	}
	return r, outs, nil
}

// Collect reads an Execute stream to its end and classifies it. A transport
// failure (the RPC itself failed) is returned as the gRPC error; a stream
// that ended cleanly but broke the contract gives a *ProtocolError.
func Collect(stream grpc.ServerStreamingClient[toolsv1.ExecuteResponse]) (*toolsv1.ToolExecutionResult, []*toolsv1.ToolOutput, error) {
	var msgs []*toolsv1.ExecuteResponse
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return CheckExecuteStream(msgs)
		}
		if err != nil {
			return nil, nil, err
		}
		msgs = append(msgs, m)
	}
}

// CheckResult checks that a result is well formed: its content holds only
// blocks a tool result may carry (text, image, extension), each complete;
// meta, when present, is JSON; an error class only on an error result;
// contexts carry a source and valid content; a view, when present, has a card.
func CheckResult(r *toolsv1.ToolExecutionResult) error {
	if err := checkBlocks("content", r.GetContent()); err != nil {
		return err
	}
	if r.Meta != nil && !json.Valid([]byte(r.GetMeta())) {
		return protocolErr("meta is not valid JSON")
	}
	if r.GetError() != nil && !r.GetIsError() {
		return protocolErr("a successful result carries an error class (%s)", r.GetError().GetCode())
	}
	for i, hc := range r.GetAdditionalContexts() {
		if hc.GetSource().GetKind() == nil {
			return protocolErr("additional_contexts[%d] has no source", i)
		}
		if err := checkBlocks(fmt.Sprintf("additional_contexts[%d].content", i), hc.GetContent()); err != nil {
			return err
		}
		if hc.Meta != nil && !json.Valid([]byte(hc.GetMeta())) {
			return protocolErr("additional_contexts[%d].meta is not valid JSON", i)
		}
	}
	if r.GetView() != nil && r.GetView().GetCard() == nil {
		return protocolErr("view has no card")
	}
	return nil
}

func checkBlocks(where string, blocks []*llmv1.ContentBlock) error {
	for i, b := range blocks {
		switch v := b.GetBlock().(type) {
		case *llmv1.ContentBlock_Text:
			if v.Text == nil {
				return protocolErr("%s[%d] is an empty text block", where, i)
			}
			if !utf8.ValidString(v.Text.GetText()) {
				return protocolErr("%s[%d] is not valid UTF-8", where, i)
			}
		case *llmv1.ContentBlock_Image:
			img := v.Image
			switch src := img.GetSource().(type) {
			case *llmv1.ImageBlock_Url:
				if src.Url == "" {
					return protocolErr("%s[%d] is an image with an empty url", where, i)
				}
			case *llmv1.ImageBlock_Data:
				if img.GetMimeType() == "" {
					return protocolErr("%s[%d] is an inline image without a mime_type", where, i)
				}
			default:
				return protocolErr("%s[%d] is an image with neither url nor data", where, i)
			}
		case *llmv1.ContentBlock_Extension:
			if v.Extension.GetType() == "" {
				return protocolErr("%s[%d] is an extension block without a type", where, i)
			}
			if !json.Valid([]byte(v.Extension.GetJson())) {
				return protocolErr("%s[%d] is an extension block whose json is not valid JSON", where, i)
			}
		case *llmv1.ContentBlock_Audio:
			if len(v.Audio.GetData()) == 0 || v.Audio.GetMimeType() == "" {
				return protocolErr("%s[%d] is an audio block without data or mime_type", where, i)
			}
		case *llmv1.ContentBlock_Document:
			if v.Document.GetUri() == "" || v.Document.GetContent() == nil {
				return protocolErr("%s[%d] is a document block without a uri or content", where, i)
			}
			if !utf8.ValidString(v.Document.GetText()) {
				return protocolErr("%s[%d] is a document whose text is not valid UTF-8", where, i)
			}
		case *llmv1.ContentBlock_ResourceLink:
			if v.ResourceLink.GetUri() == "" {
				return protocolErr("%s[%d] is a resource link without a uri", where, i)
			}
		case *llmv1.ContentBlock_Reasoning:
			return protocolErr("%s[%d] is a reasoning block, which a tool result cannot carry", where, i)
		case *llmv1.ContentBlock_ToolCall:
			return protocolErr("%s[%d] is a tool_call block, which a tool result cannot carry", where, i)
		case *llmv1.ContentBlock_ToolResult:
			return protocolErr("%s[%d] is a tool_result block, which a tool result cannot carry", where, i)
		default:
			return protocolErr("%s[%d] has no block variant", where, i)
		}
	}
	return nil
}
