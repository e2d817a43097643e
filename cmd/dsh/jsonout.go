package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The CLI's --json: proto field names, every field including zero values
// (`"seq": 0`), and 64-bit integers as JSON numbers (protojson writes them
// as strings) so jq and scripts compare them as numbers. The session store's
// canonical encoding (session.MarshalEventJSON) is not this one.
var cliJSONOpts = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// cliJSON encodes m for --json on one line.
func cliJSON(m proto.Message) ([]byte, error) {
	b, err := cliJSONOpts.Marshal(m)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	int64sAsNumbers(m.ProtoReflect().Descriptor(), v)
	return json.Marshal(v)
}

// printJSON writes one proto message as a single JSON line.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := cliJSON(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// int64sAsNumbers rewrites, in the decoded protojson v of a message of type
// md, the string values of 64-bit integer fields as numbers.
func int64sAsNumbers(md protoreflect.MessageDescriptor, v any) {
	obj, ok := v.(map[string]any)
	if !ok || md.FullName().Parent() == "google.protobuf" {
		return // well-known types have their own JSON forms
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		val, ok := obj[string(fd.Name())]
		if !ok {
			continue
		}
		switch {
		case fd.IsMap():
			if m, ok := val.(map[string]any); ok {
				for k, e := range m {
					m[k] = convert(fd.MapValue(), e)
				}
			}
		case fd.IsList():
			if l, ok := val.([]any); ok {
				for j, e := range l {
					l[j] = convert(fd, e)
				}
			}
		default:
			obj[string(fd.Name())] = convert(fd, val)
		}
	}
}

// convert returns one value of field fd with 64-bit integers as numbers.
func convert(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok {
			return json.Number(s)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		int64sAsNumbers(fd.Message(), v)
	}
	return v
}
