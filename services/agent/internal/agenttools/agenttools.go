// Package agenttools is the agent's in-process toolhost: tools that need the
// agent's own state, served through the same registry and staged pipeline
// as remote toolhosts (interceptors, approvals, durability checkpoints and
// post-execute apply to them alike; design round2.md §5). The first is
// ask_user_question (semantics.md §7.14).
package agenttools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// HostName is the registry name of the in-process host.
const HostName = "agent"

// AskUserQuestion is the tool name.
const AskUserQuestion = "ask_user_question"

// Asker asks a session's user questions and waits for the answers.
type Asker interface {
	Ask(ctx context.Context, ex *toolsv1.ToolExecution, questions []*sessionv1.Question) ([]*sessionv1.QuestionAnswer, error)
}

// Host serves the agent-side tools. Askers finds a session's Asker (nil when
// the session is not live).
type Host struct {
	Askers func(sessionID string) Asker
	// Delegation serves the subagent tools (services/agent/internal/subagent);
	// nil: none.
	Delegation Delegation
}

// Delegation is a group of agent-side tools served by another package.
type Delegation interface {
	Tools() []*toolsv1.ToolDescriptor
	Owns(name string) bool
	Execute(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult
}

const askDescription = "Ask the user one or more questions and wait for the answers. Use it when a decision " +
	"needs the user's preference or knowledge (which option, which file, whether to proceed) and you cannot " +
	"reasonably decide yourself. Offer options when the answer is a choice; the user may also answer in free text. " +
	"Returns {\"answers\":[{\"id\",\"selected\":[labels],\"custom\":text}]}. When nobody can answer, the call " +
	"fails and says so: then decide yourself and state your assumption."

const askParameters = `{"type":"object","properties":{"questions":{"type":"array","minItems":1,"items":{"type":"object",` +
	`"properties":{"id":{"type":"string","description":"Unique id of the question within this call."},` +
	`"question":{"type":"string","description":"The question."},` +
	`"detail":{"type":"string","description":"Optional context for the user."},` +
	`"header":{"type":"string","description":"Optional short header (a few words)."},` +
	`"options":{"type":"array","items":{"type":"object","properties":{"label":{"type":"string"},"description":{"type":"string"}},"required":["label"]}},` +
	`"multi_select":{"type":"boolean","description":"Whether several options may be selected."}},` +
	`"required":["id","question"]}}},"required":["questions"]}`

// Tools lists the agent-side tools.
func (h *Host) Tools() []*toolsv1.ToolDescriptor {
	out := []*toolsv1.ToolDescriptor{{
		Schema:      &llmv1.ToolSchema{Name: AskUserQuestion, Description: askDescription, Parameters: askParameters},
		Concurrency: toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_UNSPECIFIED,
	}}
	if h.Delegation != nil {
		out = append(out, h.Delegation.Tools()...)
	}
	return out
}

// Execute runs one call.
func (h *Host) Execute(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
	if h.Delegation != nil && h.Delegation.Owns(ex.GetName()) {
		return h.Delegation.Execute(ctx, ex)
	}
	if ex.GetName() != AskUserQuestion {
		return errorResult("unknown tool: "+ex.GetName(), "ToolNotFoundError", "UNKNOWN_TOOL")
	}
	questions, err := parseQuestions(ex.GetArguments())
	if err != nil {
		return errorResult(err.Error(), "UserInteractionError", "INVALID_QUESTIONS")
	}
	var asker Asker
	if h.Askers != nil {
		asker = h.Askers(ex.GetContext().GetSessionId())
	}
	if asker == nil {
		return errorResult("nobody can answer questions in this session", "UserInteractionError", "NO_PROVIDER")
	}
	answers, err := asker.Ask(ctx, ex, questions)
	if err != nil {
		code := "NO_ANSWER"
		var coded interface{ Code() string }
		if errors.As(err, &coded) {
			code = coded.Code()
		}
		return errorResult(err.Error(), "UserInteractionError", code)
	}
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(encodeAnswers(answers))}}
}

type answerJSON struct {
	ID       string   `json:"id"`
	Selected []string `json:"selected"`
	Custom   *string  `json:"custom,omitempty"`
}

// encodeAnswers is the tool's compact result {"answers":[...]}.
func encodeAnswers(as []*sessionv1.QuestionAnswer) string {
	out := struct {
		Answers []answerJSON `json:"answers"`
	}{Answers: make([]answerJSON, 0, len(as))}
	for _, a := range as {
		sel := a.GetSelected()
		if sel == nil {
			sel = []string{}
		}
		out.Answers = append(out.Answers, answerJSON{ID: a.GetId(), Selected: sel, Custom: a.Custom})
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// parseQuestions reads and checks the tool's arguments.
func parseQuestions(args string) ([]*sessionv1.Question, error) {
	var in struct {
		Questions []struct {
			ID       string `json:"id"`
			Question string `json:"question"`
			Detail   string `json:"detail"`
			Header   string `json:"header"`
			Options  []struct {
				Label       string `json:"label"`
				Description string `json:"description"`
			} `json:"options"`
			MultiSelect bool `json:"multi_select"`
		} `json:"questions"`
	}
	if err := json.Unmarshal([]byte(args), &in); err != nil {
		return nil, fmt.Errorf("arguments are not valid JSON of the form {\"questions\":[...]}: %v", err)
	}
	if len(in.Questions) == 0 {
		return nil, errors.New("questions must hold at least one question")
	}
	seen := map[string]bool{}
	out := make([]*sessionv1.Question, 0, len(in.Questions))
	for i, q := range in.Questions {
		switch {
		case strings.TrimSpace(q.ID) == "":
			return nil, fmt.Errorf("questions[%d] needs an id", i)
		case seen[q.ID]:
			return nil, fmt.Errorf("questions[%d]: id %q is used twice", i, q.ID)
		case strings.TrimSpace(q.Question) == "":
			return nil, fmt.Errorf("questions[%d] needs the question text", i)
		}
		seen[q.ID] = true
		pq := &sessionv1.Question{Id: q.ID, Question: q.Question, Detail: q.Detail, Header: q.Header, MultiSelect: q.MultiSelect}
		labels := map[string]bool{}
		for j, o := range q.Options {
			if strings.TrimSpace(o.Label) == "" || labels[o.Label] {
				return nil, fmt.Errorf("questions[%d].options[%d] needs a unique, non-empty label", i, j)
			}
			labels[o.Label] = true
			pq.Options = append(pq.Options, &sessionv1.QuestionOption{Label: o.Label, Description: o.Description})
		}
		out = append(out, pq)
	}
	return out, nil
}

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func errorResult(msg, name, code string) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("Error: " + msg)}, IsError: true,
		Error: &toolsv1.ToolErrorInfo{Name: name, Code: code}}
}
