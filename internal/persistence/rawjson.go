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
// not hold valid JSON, naming the field. The rules are the kernel's
// (session.Log.Append applies the same ones): an optional raw-JSON field that
// is present must be valid JSON, even when empty, and an Extension's json
// always must.
func CheckRawJSON(m proto.Message) error {
	return walkRawJSON(m.ProtoReflect())
}

func walkRawJSON(m protoreflect.Message) error {
	if m.Descriptor().FullName() == "dsh.llm.v1.Extension" {
		// An extension always carries JSON data, even when its field is
		// empty (and so not visited by Range): {} or null for none.
		if s := m.Get(m.Descriptor().Fields().ByName("json")).String(); !json.Valid([]byte(s)) {
			return fmt.Errorf("field dsh.llm.v1.Extension.json does not hold valid JSON (use {} or null for no data)")
		}
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() == protoreflect.StringKind && !fd.IsList() && !fd.IsMap():
			if rawJSONFields[fd.FullName()] && !json.Valid([]byte(v.String())) {
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
