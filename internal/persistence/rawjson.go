package persistence

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// rawJSONFields names the string fields of the dsh protos that carry raw,
// lossless JSON and must therefore hold valid JSON when set. Tool-call
// arguments are deliberately absent: they are the model's raw output and may
// be invalid (the loop answers them with INVALID_ARGS).
var rawJSONFields = map[protoreflect.FullName]bool{
	"dsh.llm.v1.Extension.json":                   true,
	"dsh.llm.v1.AssistantProvenance.replay_state": true,
	"dsh.llm.v1.FinishChunk.replay_state":         true,
	"dsh.llm.v1.ToolSchema.parameters":            true,
	"dsh.session.v1.PromptPrefixContext.meta":     true,
	"dsh.session.v1.ContextMessage.meta":          true,
	"dsh.session.v1.ToolResult.meta":              true,
	"dsh.tools.v1.HookContext.meta":               true,
	"dsh.tools.v1.ToolExecutionResult.meta":       true,
}

// CheckRawJSON reports the first raw-JSON field of m that is set and does
// not hold valid JSON, naming the field.
func CheckRawJSON(m proto.Message) error {
	return walkRawJSON(m.ProtoReflect())
}

func walkRawJSON(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() == protoreflect.StringKind && !fd.IsList() && !fd.IsMap():
			if rawJSONFields[fd.FullName()] && v.String() != "" && !json.Valid([]byte(v.String())) {
				err = fmt.Errorf("field %s does not hold valid JSON", fd.FullName())
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			switch {
			case fd.IsList():
				l := v.List()
				for i := 0; i < l.Len() && err == nil; i++ {
					err = walkRawJSON(l.Get(i).Message())
				}
			case fd.IsMap():
				if fd.MapValue().Kind() == protoreflect.MessageKind {
					v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
						err = walkRawJSON(mv.Message())
						return err == nil
					})
				}
			default:
				err = walkRawJSON(v.Message())
			}
		}
		return err == nil
	})
	return err
}
