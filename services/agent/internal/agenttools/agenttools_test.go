package agenttools

import (
	"context"
	"errors"
	"strings"
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

type askerFunc func(ctx context.Context, ex *toolsv1.ToolExecution, qs []*sessionv1.Question) ([]*sessionv1.QuestionAnswer, error)

func (f askerFunc) Ask(ctx context.Context, ex *toolsv1.ToolExecution, qs []*sessionv1.Question) ([]*sessionv1.QuestionAnswer, error) {
	return f(ctx, ex, qs)
}

type codedErr struct{}

func (codedErr) Error() string { return "nobody answered" }
func (codedErr) Code() string  { return "NO_ANSWER" }

func TestAskUserQuestion(t *testing.T) {
	t.Parallel()
	custom := "mine"
	answering := askerFunc(func(_ context.Context, _ *toolsv1.ToolExecution, qs []*sessionv1.Question) ([]*sessionv1.QuestionAnswer, error) {
		if len(qs) != 1 || qs[0].GetOptions()[1].GetLabel() != "b" || !qs[0].GetMultiSelect() {
			return nil, errors.New("questions not passed through")
		}
		return []*sessionv1.QuestionAnswer{{Id: "q", Custom: &custom}}, nil
	})
	tests := []struct {
		name, args string
		asker      Asker
		want, code string
	}{
		{"answered", `{"questions":[{"id":"q","question":"which?","options":[{"label":"a"},{"label":"b"}],"multi_select":true}]}`, answering,
			`{"answers":[{"id":"q","selected":[],"custom":"mine"}]}`, ""},
		{"no questions", `{"questions":[]}`, answering, "at least one question", "INVALID_QUESTIONS"},
		{"not JSON", `{"questions":`, answering, "not valid JSON", "INVALID_QUESTIONS"},
		{"duplicate ids", `{"questions":[{"id":"q","question":"a"},{"id":"q","question":"b"}]}`, answering, "used twice", "INVALID_QUESTIONS"},
		{"empty question", `{"questions":[{"id":"q","question":" "}]}`, answering, "question text", "INVALID_QUESTIONS"},
		{"duplicate option", `{"questions":[{"id":"q","question":"a","options":[{"label":"x"},{"label":"x"}]}]}`, answering, "unique", "INVALID_QUESTIONS"},
		{"nobody to ask", `{"questions":[{"id":"q","question":"a"}]}`, nil, "nobody can answer", "NO_PROVIDER"},
		{"unanswered", `{"questions":[{"id":"q","question":"a"}]}`, askerFunc(func(context.Context, *toolsv1.ToolExecution, []*sessionv1.Question) ([]*sessionv1.QuestionAnswer, error) {
			return nil, codedErr{}
		}), "Error: nobody answered", "NO_ANSWER"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &Host{Askers: func(string) Asker { return tc.asker }}
			res := h.Execute(t.Context(), &toolsv1.ToolExecution{Name: AskUserQuestion, Arguments: tc.args, Context: &toolsv1.ToolContext{SessionId: "s"}})
			text := res.GetContent()[0].GetText().GetText()
			if !strings.Contains(text, tc.want) || res.GetError().GetCode() != tc.code || res.GetIsError() != (tc.code != "") {
				t.Fatalf("result %q code %q error %v, want %q code %q", text, res.GetError().GetCode(), res.GetIsError(), tc.want, tc.code)
			}
		})
	}
	if got := (&Host{}).Tools()[0].GetSchema().GetName(); got != AskUserQuestion {
		t.Fatalf("tools = %s", got)
	}
}
