// Package todo holds the built-in todo_write tool: the model replaces its
// whole task list; the tool validates and renders it, and returns the list as
// meta so the agent can append the todo/write event (last write wins).
package todo

import (
	"context"
	"fmt"
	"strings"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// Item is one task.
type Item struct {
	Content string `json:"content" jsonschema:"required,description=What to do, in the imperative."`
	Status  string `json:"status" jsonschema:"required,enum=pending|in_progress|completed,description=The task's state."`
}

// Args are todo_write's parameters.
type Args struct {
	Todos []Item `json:"todos" jsonschema:"required,description=The complete task list; it replaces the previous one."`
}

// Meta is the tool's result payload: the list as written.
type Meta struct {
	Todos []Item `json:"todos"`
}

// Tool returns todo_write.
func Tool() toolsdk.Tool {
	return toolsdk.Define("todo_write",
		"Replace your task list for this session with the given full list. Use it for multi-step work; keep at most one task in_progress and mark tasks completed as soon as they are done.",
		write,
		toolsdk.PresentCall(func(a Args) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{
				Title: fmt.Sprintf("Update todos (%d)", len(a.Todos)), Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_OTHER,
			}}}
		}),
	)
}

func write(_ context.Context, _ *toolsdk.Call, a Args) (toolsdk.Result, error) {
	var bad []string
	for i, t := range a.Todos {
		if strings.TrimSpace(t.Content) == "" {
			bad = append(bad, fmt.Sprintf("%q must not be empty", fmt.Sprintf("todos[%d].content", i)))
		}
	}
	if len(bad) > 0 {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: bad}
	}
	var b strings.Builder
	if len(a.Todos) == 0 {
		b.WriteString("Todo list cleared.")
	} else {
		b.WriteString("Todo list updated:")
		for _, t := range a.Todos {
			mark := map[string]string{"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}[t.Status]
			fmt.Fprintf(&b, "\n%s %s", mark, t.Content)
		}
		if n := countStatus(a.Todos, "in_progress"); n > 1 {
			fmt.Fprintf(&b, "\nNote: %d tasks are in_progress; keep at most one.", n)
		}
	}
	todos := a.Todos
	if todos == nil {
		todos = []Item{}
	}
	res := toolsdk.Text(b.String())
	res.Meta = Meta{Todos: todos}
	return res, nil
}

func countStatus(ts []Item, s string) int {
	n := 0
	for _, t := range ts {
		if t.Status == s {
			n++
		}
	}
	return n
}
