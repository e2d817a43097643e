package grpcserver

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request carrying invalid UTF-8 in a proto3 string field fails to
// unmarshal, and grpc-go turns every codec error into codes.Internal ("failed
// to unmarshal"), blaming the server for the client's bad input. The codec
// below catches exactly that failure, decodes the request again with the bad
// strings made valid, and marks the message with an unknown field naming the
// offending field; the interceptors then refuse the call with
// InvalidArgument before any handler sees it. Well-formed requests take the
// default codec's path unchanged (one extra error check).

// badUTF8Field is the field number of the marker: the largest legal number,
// never used by a dsh message.
const badUTF8Field protowire.Number = protowire.MaxValidNumber

// utf8Codec is the proto codec with the invalid-UTF-8 recovery above.
type utf8Codec struct{ base encoding.CodecV2 }

func newUTF8Codec() utf8Codec { return utf8Codec{base: encoding.GetCodecV2(gproto.Name)} }

func (c utf8Codec) Name() string                           { return gproto.Name }
func (c utf8Codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }
func (c utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		return err
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	fixed, field := validUTF8(data.Materialize(), m.ProtoReflect().Descriptor())
	if field == "" {
		return err
	}
	proto.Reset(m)
	if uerr := proto.Unmarshal(fixed, m); uerr != nil {
		return err
	}
	r := m.ProtoReflect()
	mark := protowire.AppendTag(r.GetUnknown(), badUTF8Field, protowire.BytesType)
	r.SetUnknown(protowire.AppendString(mark, string(field)))
	return nil
}

// validUTF8 rewrites the wire bytes b of a message of type md with every
// invalid UTF-8 sequence in a string field replaced by U+FFFD, and returns the
// full name of the first such field ("" when none was found).
func validUTF8(b []byte, md protoreflect.MessageDescriptor) ([]byte, protoreflect.FullName) {
	out := make([]byte, 0, len(b))
	var first protoreflect.FullName
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, ""
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, ""
		}
		field := b[:n+m]
		b = b[n+m:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
			if first == "" {
				first = fd.FullName()
			}
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendString(out, strings.ToValidUTF8(string(v), "\uFFFD"))
		case fd.Kind() == protoreflect.MessageKind:
			inner, name := validUTF8(v, fd.Message())
			if inner == nil {
				return nil, ""
			}
			if first == "" {
				first = name
			}
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendBytes(out, inner)
		default:
			out = append(out, field...)
		}
	}
	return out, first
}

// checkUTF8 returns InvalidArgument when req carries the marker the codec
// leaves on a request that had invalid UTF-8 in a string field.
func checkUTF8(req any) error {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	unk := m.ProtoReflect().GetUnknown()
	for len(unk) > 0 {
		num, typ, n := protowire.ConsumeTag(unk)
		if n < 0 {
			return nil
		}
		l := protowire.ConsumeFieldValue(num, typ, unk[n:])
		if l < 0 {
			return nil
		}
		if num == badUTF8Field && typ == protowire.BytesType {
			name, _ := protowire.ConsumeString(unk[n:])
			return status.Error(codes.InvalidArgument, fmt.Sprintf("%s: invalid UTF-8: every string field must be valid UTF-8 (send binary data in a bytes field or encode it)", shortField(name)))
		}
		unk = unk[n+l:]
	}
	return nil
}

// shortField turns "dsh.agent.v1.SendRequest.session_id" into
// "SendRequest.session_id".
func shortField(full string) string {
	parts := strings.Split(full, ".")
	if len(parts) >= 2 {
		return parts[len(parts)-2] + "." + parts[len(parts)-1]
	}
	return full
}
