package todo_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/todo"
)

func TestTodoWrite(t *testing.T) {
	t.Parallel()
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, todo.Tool())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, args, text, meta, code string
	}{
		{"list", `{"todos":[{"content":"a","status":"completed"},{"content":"b","status":"in_progress"},{"content":"c","status":"pending"}]}`,
			"Todo list updated:\n[x] a\n[~] b\n[ ] c", `{"todos":[{"content":"a","status":"completed"},{"content":"b","status":"in_progress"},{"content":"c","status":"pending"}]}`, ""},
		{"cleared", `{"todos":[]}`, "Todo list cleared.", `{"todos":[]}`, ""},
		{"two in progress noted", `{"todos":[{"content":"a","status":"in_progress"},{"content":"b","status":"in_progress"}]}`,
			"Todo list updated:\n[~] a\n[~] b\nNote: 2 tasks are in_progress; keep at most one.", `{"todos":[{"content":"a","status":"in_progress"},{"content":"b","status":"in_progress"}]}`, ""},
		{"bad status", `{"todos":[{"content":"a","status":"done"}]}`,
			`Error: invalid arguments: "todos[0].status" must be one of [pending, in_progress, completed]`, "", "INVALID_ARGS"},
		{"empty content", `{"todos":[{"content":" ","status":"pending"}]}`,
			`Error: invalid arguments: "todos[0].content" must not be empty`, "", "INVALID_ARGS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := h.Run(t.Context(), &toolsv1.ToolExecution{Name: "todo_write", Arguments: tt.args, Context: &toolsv1.ToolContext{Cwd: "/"}}, nil)
			if diff := cmp.Diff(tt.text, toolsdk.ResultText(r.GetContent())); diff != "" {
				t.Errorf("text (-want +got):\n%s", diff)
			}
			if r.GetMeta() != tt.meta || r.GetError().GetCode() != tt.code {
				t.Errorf("meta %q code %q", r.GetMeta(), r.GetError().GetCode())
			}
		})
	}
}
