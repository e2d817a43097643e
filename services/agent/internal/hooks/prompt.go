package hooks

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// DefaultIdentity is the harness identity section (order -100).
const DefaultIdentity = "You are dsh, a coding agent running as {{provider}}/{{model}} in {{cwd}}."

// Section is one system-prompt section.
type Section struct {
	// Name is unique within a prompt.
	Name string
	// Order sorts sections ascending; ties keep registration order.
	Order float64
	// Text may use {{provider}}, {{model}} and {{cwd}}.
	Text string
}

// Prompt is the system-prompt assembly of semantics.md §7.9: the identity
// (order -100, replaced by the session's persona), the deployment persona
// (order 0), tool guidance (order 100-199, only when tools are visible),
// extra sections, and the session's own system_prompt text last.
type Prompt struct {
	// Identity overrides DefaultIdentity; "-" drops it.
	Identity string
	// Persona is the deployment persona (order 0), a template.
	Persona string
	// ToolGuidance is shown when the session sees tools (order 100).
	ToolGuidance string
	// Sections are extra deployment sections.
	Sections []Section
}

// AssembleInput is what one assembly sees.
type AssembleInput struct {
	Provider, Model, Cwd string
	// Persona replaces the identity section when non-empty.
	Persona string
	// SystemPrompt is appended last when non-empty.
	SystemPrompt string
	// Tools are the visible tools.
	Tools []*llmv1.ToolSchema
	// ApprovalNever says that the session's approval policy is never
	// (semantics.md §7.3: the prompt states what that means).
	ApprovalNever bool
}

// ApprovalNeverText is the section of a session whose approval policy is
// never.
const ApprovalNeverText = "Approval policy: never. Tool calls that need a person's approval are refused " +
	"without asking anyone, and questions to the user cannot be answered: prefer actions that need no " +
	"approval, and when you would ask, decide yourself and say what you assumed."

// Assemble renders the system prompt: sections ascending by order,
// interpolated strictly, empty ones dropped, joined by a blank line.
func (p *Prompt) Assemble(in AssembleInput) (string, error) {
	identity := p.Identity
	if identity == "" {
		identity = DefaultIdentity
	}
	if identity == "-" {
		identity = ""
	}
	if in.Persona != "" {
		identity = in.Persona
	}
	secs := []Section{{Name: "identity", Order: -100, Text: identity}, {Name: "deployment:persona", Order: 0, Text: p.Persona}}
	if len(in.Tools) > 0 && p.ToolGuidance != "" {
		secs = append(secs, Section{Name: "tools:guidance", Order: 100, Text: p.ToolGuidance})
	}
	if in.ApprovalNever {
		secs = append(secs, Section{Name: "approval:never", Order: 900, Text: ApprovalNeverText})
	}
	secs = append(secs, p.Sections...)
	secs = append(secs, Section{Name: "session:system", Order: 1000, Text: in.SystemPrompt})
	sort.SliceStable(secs, func(i, j int) bool { return secs[i].Order < secs[j].Order })
	vars := map[string]string{"provider": in.Provider, "model": in.Model, "cwd": in.Cwd}
	var parts []string
	for _, s := range secs {
		text, err := Render(s.Text, vars)
		if err != nil {
			return "", fmt.Errorf("system prompt section %q: %w", s.Name, err)
		}
		if strings.TrimSpace(text) != "" {
			parts = append(parts, text)
		}
	}
	return strings.Join(parts, "\n\n"), nil
}

var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)

// Render interpolates {{name}} strictly: an unknown or valueless variable, or
// a malformed group, is an error; a lone "{{" with no later "}}" passes
// verbatim; substituted values are not re-scanned.
func Render(tmpl string, vars map[string]string) (string, error) {
	var b strings.Builder
	rest := tmpl
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		j := strings.Index(rest[i+2:], "}}")
		if j < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		name := strings.TrimSpace(rest[i+2 : i+2+j])
		if !varName.MatchString(name) {
			return "", fmt.Errorf("malformed template group %q", rest[i:i+4+j])
		}
		v, ok := vars[name]
		if !ok {
			return "", fmt.Errorf("unknown template variable %q", name)
		}
		if v == "" {
			return "", fmt.Errorf("template variable %q has no value", name)
		}
		b.WriteString(rest[:i])
		b.WriteString(v)
		rest = rest[i+4+j:]
	}
}
