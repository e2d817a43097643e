package grpcserver

import (
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// rawCodec sends pre-encoded frames as they are, so a test can put bytes on
// the wire that a well-behaved client would refuse to marshal.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// badString encodes field num as a string holding invalid UTF-8.
func badString(num protowire.Number) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(b, []byte("bad \xff\xfe"))
}

func TestInvalidUTF8IsInvalidArgument(t *testing.T) {
	_, conn, _, _ := start(t, nil)
	frame := badString(1) // HealthCheckRequest.service
	tests := []struct {
		name string
		call func() error
	}{
		{"unary", func() error {
			var out healthpb.HealthCheckResponse
			return conn.Invoke(t.Context(), "/grpc.health.v1.Health/Check", &frame, &out, grpc.ForceCodecV2(rawCodec{}))
		}},
		{"stream", func() error {
			desc := &grpc.StreamDesc{ServerStreams: true}
			cs, err := conn.NewStream(t.Context(), desc, "/grpc.health.v1.Health/Watch", grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				return err
			}
			if err := cs.SendMsg(&frame); err != nil {
				return err
			}
			if err := cs.CloseSend(); err != nil {
				return err
			}
			var out healthpb.HealthCheckResponse
			return cs.RecvMsg(&out)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "HealthCheckRequest.service") {
				t.Fatalf("got %v, want InvalidArgument naming HealthCheckRequest.service", err)
			}
		})
	}
	// A well-formed request still works on the same connection.
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("valid request: %v", err)
	}
}

func TestUTF8CodecNamesNestedField(t *testing.T) {
	// SendRequest{session_id: "s", content: [{text: {text: <bad>}}]}
	text := badString(1)                                                                   // TextBlock.text
	block := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), text) // ContentBlock.text (field 1)
	var req []byte
	req = protowire.AppendString(protowire.AppendTag(req, 1, protowire.BytesType), "s")
	req = protowire.AppendBytes(protowire.AppendTag(req, 2, protowire.BytesType), block)
	if proto.Unmarshal(req, &agentv1.SendRequest{}) == nil {
		t.Fatal("the fixture should not decode with the default codec")
	}
	var got agentv1.SendRequest
	if err := newUTF8Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(req)}, &got); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	err := checkUTF8(&got)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "TextBlock.text") {
		t.Fatalf("checkUTF8 = %v, want InvalidArgument naming TextBlock.text", err)
	}
	if got.GetSessionId() != "s" || got.GetContent()[0].GetText() == nil {
		t.Fatalf("the rest of the message was lost: %v", &got)
	}
	// A valid message carries no marker.
	ok := &agentv1.SendRequest{SessionId: "s", Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "héllo"}}}}}
	b, _ := proto.Marshal(ok)
	var back agentv1.SendRequest
	if err := newUTF8Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &back); err != nil || checkUTF8(&back) != nil {
		t.Fatalf("valid message: %v %v", err, checkUTF8(&back))
	}
}

// FuzzUTF8Codec: the codec never panics, and whatever it accepts without a
// marker decodes exactly as the default codec would.
func FuzzUTF8Codec(f *testing.F) {
	f.Add(badString(1))
	f.Add([]byte{0x0a, 0x01, 's'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got agentv1.SendRequest
		if err := newUTF8Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
			return
		}
		if checkUTF8(&got) != nil {
			return
		}
		var want agentv1.SendRequest
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatalf("codec accepted what proto refuses: %v", err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("codec decoded %v, proto %v", &got, &want)
		}
	})
}
