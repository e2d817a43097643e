package toolstream_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/toolstream"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

func out(s string) *toolsv1.ExecuteResponse {
	return &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Output{Output: &toolsv1.ToolOutput{Stream: "stdout", Text: s}}}
}

func res(r *toolsv1.ToolExecutionResult) *toolsv1.ExecuteResponse {
	return &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Result{Result: r}}
}

func textRes(s string) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}}}
}

func blocksRes(bs ...*llmv1.ContentBlock) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{Content: bs}
}

func ptr[T any](v T) *T { return &v }

func TestCheckExecuteStream(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		msgs    []*toolsv1.ExecuteResponse
		wantErr string // substring of the reason; "" = valid
		outputs int
	}{
		{"result only", []*toolsv1.ExecuteResponse{res(textRes("ok"))}, "", 0},
		{"outputs then result", []*toolsv1.ExecuteResponse{out("a"), out("b"), res(textRes("ok"))}, "", 2},
		{"empty content is valid", []*toolsv1.ExecuteResponse{res(&toolsv1.ToolExecutionResult{})}, "", 0},
		{"image url", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://x/y.png"}}}}))}, "", 0},
		{"extension", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "audio", Json: `{"a":1}`}}}))}, "", 0},
		{"audio, document, resource link", []*toolsv1.ExecuteResponse{res(blocksRes(
			&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: []byte{1}, MimeType: "audio/wav"}}},
			&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a", Content: &llmv1.DocumentBlock_Text{Text: ""}}}},
			&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Uri: "file:///b"}}, Annotations: &llmv1.ContentAnnotations{Audience: []string{"user"}}}))}, "", 0},
		{"audio without mime", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: []byte{1}}}}))}, "audio block without", 0},
		{"document without content", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a"}}}))}, "document block without", 0},
		{"resource link without uri", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Name: "x"}}}))}, "resource link without a uri", 0},
		{"error result with class", []*toolsv1.ExecuteResponse{res(&toolsv1.ToolExecutionResult{Content: textRes("Error: x").Content, IsError: true, Error: &toolsv1.ToolErrorInfo{Code: "X"}})}, "", 0},

		{"no messages", nil, "ended without a result", 0},
		{"outputs only", []*toolsv1.ExecuteResponse{out("a")}, "ended without a result", 0},
		{"two results", []*toolsv1.ExecuteResponse{res(textRes("a")), res(textRes("b"))}, "second result", 0},
		{"output after result", []*toolsv1.ExecuteResponse{res(textRes("a")), out("late")}, "came after the result", 0},
		{"empty message", []*toolsv1.ExecuteResponse{{}}, "neither output nor result", 0},
		{"nil result", []*toolsv1.ExecuteResponse{{Event: &toolsv1.ExecuteResponse_Result{}}}, "empty result", 0},
		{"block without variant", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{}))}, "content[0] has no block variant", 0},
		{"tool_call block", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: "x"}}}))}, "tool_call block", 0},
		{"reasoning block", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{}}}))}, "reasoning block", 0},
		{"image without source", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{}}}))}, "neither url nor data", 0},
		{"inline image without mime", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte{1}}}}}))}, "without a mime_type", 0},
		{"extension bad json", []*toolsv1.ExecuteResponse{res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "x", Json: "{"}}}))}, "not valid JSON", 0},
		{"meta not json", []*toolsv1.ExecuteResponse{res(&toolsv1.ToolExecutionResult{Meta: ptr("{nope")})}, "meta is not valid JSON", 0},
		{"error class on success", []*toolsv1.ExecuteResponse{res(&toolsv1.ToolExecutionResult{Error: &toolsv1.ToolErrorInfo{Code: "X"}})}, "successful result carries an error class", 0},
		{"context without source", []*toolsv1.ExecuteResponse{res(&toolsv1.ToolExecutionResult{AdditionalContexts: []*toolsv1.HookContext{{}}})}, "additional_contexts[0] has no source", 0},
		{"view without card", []*toolsv1.ExecuteResponse{res(&toolsv1.ToolExecutionResult{View: &toolsv1.ToolResultView{}})}, "view has no card", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, outs, err := toolstream.CheckExecuteStream(c.msgs)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckExecuteStream: %v", err)
				}
				if diff := cmp.Diff(c.msgs[len(c.msgs)-1].GetResult(), r, protocmp.Transform()); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
				if len(outs) != c.outputs {
					t.Errorf("outputs = %d, want %d", len(outs), c.outputs)
				}
				return
			}
			var pe *toolstream.ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ProtocolError", err)
			}
			if pe.Code() != toolstream.CodeProtocolError || !strings.Contains(pe.Reason, c.wantErr) {
				t.Errorf("err = %q (code %s), want reason containing %q", pe.Reason, pe.Code(), c.wantErr)
			}
			pr := toolstream.ProtocolErrorResult(pe)
			if !pr.GetIsError() || pr.GetError().GetCode() != "TOOL_HOST_PROTOCOL_ERROR" ||
				!strings.HasPrefix(pr.GetContent()[0].GetText().GetText(), "Error: tool host protocol error: ") {
				t.Errorf("ProtocolErrorResult = %v", pr)
			}
			if err := toolstream.CheckResult(pr); err != nil {
				t.Errorf("ProtocolErrorResult is itself invalid: %v", err)
			}
		})
	}
}

// FuzzCheckExecuteStream feeds arbitrary message sequences: the checker never
// panics, and whatever it accepts is outputs followed by exactly one result.
func FuzzCheckExecuteStream(f *testing.F) {
	seed := func(msgs ...*toolsv1.ExecuteResponse) []byte {
		var b []byte
		for _, m := range msgs {
			mb, _ := proto.Marshal(m)
			b = append(b, byte(len(mb)))
			b = append(b, mb...)
		}
		return b
	}
	f.Add(seed(out("a"), res(textRes("ok"))))
	f.Add(seed(res(textRes("a")), res(textRes("b"))))
	f.Add(seed(&toolsv1.ExecuteResponse{}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []*toolsv1.ExecuteResponse
		for len(data) > 0 {
			n := int(data[0])
			data = data[1:]
			if n > len(data) {
				n = len(data)
			}
			m := &toolsv1.ExecuteResponse{}
			if proto.Unmarshal(data[:n], m) != nil {
				return
			}
			msgs = append(msgs, m)
			data = data[n:]
		}
		r, outs, err := toolstream.CheckExecuteStream(msgs)
		if err != nil {
			var pe *toolstream.ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("non-protocol error %v", err)
			}
			return
		}
		if r == nil || len(outs) != len(msgs)-1 || msgs[len(msgs)-1].GetResult() != r {
			t.Fatalf("accepted a stream that is not outputs then one result: %v", msgs)
		}
	})
}

// badHost answers Execute with a scripted (possibly malformed) stream.
type badHost struct {
	toolsv1.UnimplementedToolHostServer
	script map[string][]*toolsv1.ExecuteResponse
}

func (h *badHost) Execute(req *toolsv1.ExecuteRequest, s grpc.ServerStreamingServer[toolsv1.ExecuteResponse]) error {
	for _, m := range h.script[req.GetExecution().GetName()] {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// TestCollectMalformedHost: a real host sending malformed streams is
// classified per call, and the connection keeps serving good calls.
func TestCollectMalformedHost(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	toolsv1.RegisterToolHostServer(gs, &badHost{script: map[string][]*toolsv1.ExecuteResponse{
		"good":     {out("x"), res(textRes("ok"))},
		"none":     {out("x")},
		"two":      {res(textRes("a")), res(textRes("b"))},
		"badblock": {res(blocksRes(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{}}}))},
	}})
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := toolsv1.NewToolHostClient(conn)
	for _, name := range []string{"none", "good", "two", "good", "badblock", "good"} {
		stream, err := c.Execute(context.Background(), &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{CallId: "1", Name: name}})
		if err != nil {
			t.Fatal(err)
		}
		r, outs, err := toolstream.Collect(stream)
		var pe *toolstream.ProtocolError
		if name == "good" {
			if err != nil || r.GetContent()[0].GetText().GetText() != "ok" || len(outs) != 1 {
				t.Errorf("good call after a malformed one: %v %v %v", r, outs, err)
			}
		} else if !errors.As(err, &pe) {
			t.Errorf("%s: err = %v, want a protocol error", name, err)
		}
	}
}
