// Package prompt assembles the system prompt of a request (semantics.md
// §7.9) and the session prefix that carries the skill catalog (§7.8): named
// sections sorted by order, strict {{name}} interpolation over the
// variables provider, model, cwd and the deployment's own, the tool order
// with its <unlisted-tools> rest entry, the deployment and session persona,
// and the workspace context a toolhost reported (instruction files as a
// section, skills as a <system-reminder>).
//
// Assembly is a pure function of its input, so the request header the agent
// logs (system, tools, message prefix) is all a reader needs to reconstruct
// the request.
package prompt

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// DefaultIdentity is the harness identity section (order -100).
const DefaultIdentity = "You are dsh, a coding agent running as {{provider}}/{{model}} in {{cwd}}."

// ApprovalNeverText is the section of a session whose approval policy is
// never.
const ApprovalNeverText = "Approval policy: never. Tool calls that need a person's approval are refused " +
	"without asking anyone, and questions to the user cannot be answered: prefer actions that need no " +
	"approval, and when you would ask, decide yourself and say what you assumed."

// UnlistedTools is the rest entry of a tool order.
const UnlistedTools = "<unlisted-tools>"

// Section names and orders of the built-in sections.
const (
	SectionIdentity     = "harness:identity"
	SectionPersona      = "deployment:persona"
	SectionToolGuidance = "tools:guidance"
	SectionWorkspace    = "workspace:instructions"
	SectionApproval     = "approval:never"
	SectionSession      = "session:system"

	OrderIdentity     = -100
	OrderPersona      = 0
	OrderToolGuidance = 100
	OrderWorkspace    = 200
	OrderApproval     = 900
	OrderSession      = 1000
)

// Section is one system-prompt section.
type Section struct {
	// Name is unique within a prompt.
	Name string `json:"name"`
	// Order sorts sections ascending; ties keep registration order.
	Order float64 `json:"order"`
	// Text is a template ({{name}} interpolated strictly) unless Literal.
	Text string `json:"text"`
	// Literal text is used as is (workspace files are never templates).
	Literal bool `json:"literal,omitempty"`
}

// Config is a deployment's prompt configuration.
type Config struct {
	// Identity overrides DefaultIdentity; "-" drops it.
	Identity string `json:"identity,omitempty"`
	// Persona is the deployment persona (order 0), a template.
	Persona string `json:"persona,omitempty"`
	// ToolGuidance is shown when the session sees tools (order 100).
	ToolGuidance string `json:"tool_guidance,omitempty"`
	// Sections are extra deployment sections.
	Sections []Section `json:"sections,omitempty"`
	// Variables are deployment-defined template variables.
	Variables map[string]string `json:"variables,omitempty"`
	// ToolOrder lists tool names in the order the model sees them, with
	// exactly one UnlistedTools entry where the rest go (lexicographic).
	// Empty: lexicographic.
	ToolOrder []string `json:"tool_order,omitempty"`
}

// builtinVariables are the loop's variables; a deployment may not redefine
// them.
var builtinVariables = []string{"provider", "model", "cwd"}

// varName is the rule of variable names, compiled on first use.
var varName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`) })

// Assembler assembles prompts for one deployment configuration.
type Assembler struct {
	cfg Config
}

// New validates cfg: unique non-reserved section names, well-formed
// variable names that do not shadow provider/model/cwd, and a tool order
// with exactly one UnlistedTools entry and no repeated name.
func New(cfg Config) (*Assembler, error) {
	var errs []error
	seen := map[string]bool{SectionIdentity: true, SectionPersona: true, SectionToolGuidance: true, SectionWorkspace: true, SectionApproval: true, SectionSession: true}
	for _, s := range cfg.Sections {
		if s.Name == "" {
			errs = append(errs, errors.New("a prompt section has no name"))
		} else if seen[s.Name] {
			errs = append(errs, fmt.Errorf("prompt section name %q is used twice (or is a built-in section)", s.Name))
		}
		seen[s.Name] = true
	}
	for name := range cfg.Variables {
		if !varName().MatchString(name) {
			errs = append(errs, fmt.Errorf("prompt variable name %q is not a name (%s)", name, varName()))
		}
		if slices.Contains(builtinVariables, name) {
			errs = append(errs, fmt.Errorf("prompt variable %q is set by the agent and cannot be redefined", name))
		}
	}
	if len(cfg.ToolOrder) > 0 {
		rest, dup := 0, map[string]bool{}
		for _, n := range cfg.ToolOrder {
			if n == UnlistedTools {
				rest++
			} else if dup[n] {
				errs = append(errs, fmt.Errorf("tool order names %q twice", n))
			}
			dup[n] = true
		}
		if rest != 1 {
			errs = append(errs, fmt.Errorf("tool order must hold exactly one %s entry, has %d", UnlistedTools, rest))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cfg.Variables = maps.Clone(cfg.Variables)
	return &Assembler{cfg: cfg}, nil
}

// Input is what one assembly sees.
type Input struct {
	Provider, Model, Cwd string
	// Persona (the session's) replaces the identity section when non-empty.
	Persona string
	// SystemPrompt (the session's) is the last section when non-empty.
	SystemPrompt string
	// Tools are the visible tools (any order).
	Tools []*llmv1.ToolSchema
	// Workspace is the toolhosts' context of the cwd; nil for none.
	Workspace *toolsv1.GetWorkspaceContextResponse
	// ApprovalNever says that the session's approval policy is never
	// (semantics.md §7.3: the prompt states what that means).
	ApprovalNever bool
	// Sections come from the agent/prompt-sections hooks: each is added, or
	// replaces the same-named section (built-in ones included); an empty
	// text drops it.
	Sections []Section
}

// Assembly is an assembled request prefix.
type Assembly struct {
	// System is the rendered system prompt ("" when every section is empty).
	System string
	// Tools in the configured order.
	Tools []*llmv1.ToolSchema
	// Prefix is the default session prefix: the skill catalog reminder, or
	// nothing.
	Prefix []*llmv1.Message
}

// Assemble renders the system prompt (sections ascending by order, ties by
// registration order, templates interpolated strictly, empty sections
// dropped, joined by a blank line), orders the tools and builds the
// catalog prefix. An unknown or valueless variable, a malformed group or a
// tool order naming an unknown tool is an error naming the culprit.
func (a *Assembler) Assemble(in Input) (Assembly, error) {
	tools, err := a.orderTools(in.Tools)
	if err != nil {
		return Assembly{}, err
	}
	sys, err := a.render(in, len(tools) > 0)
	if err != nil {
		return Assembly{}, err
	}
	return Assembly{System: sys, Tools: tools, Prefix: CatalogPrefix(in.Workspace)}, nil
}

func (a *Assembler) sections(in Input, haveTools bool) []Section {
	identity := a.cfg.Identity
	if identity == "" {
		identity = DefaultIdentity
	}
	if identity == "-" {
		identity = ""
	}
	if in.Persona != "" {
		identity = in.Persona
	}
	secs := []Section{
		{Name: SectionIdentity, Order: OrderIdentity, Text: identity},
		{Name: SectionPersona, Order: OrderPersona, Text: a.cfg.Persona},
	}
	if haveTools && a.cfg.ToolGuidance != "" {
		secs = append(secs, Section{Name: SectionToolGuidance, Order: OrderToolGuidance, Text: a.cfg.ToolGuidance})
	}
	if in.ApprovalNever {
		secs = append(secs, Section{Name: SectionApproval, Order: OrderApproval, Text: ApprovalNeverText, Literal: true})
	}
	secs = append(secs, a.cfg.Sections...)
	secs = append(secs,
		Section{Name: SectionWorkspace, Order: OrderWorkspace, Text: Instructions(in.Workspace), Literal: true},
		Section{Name: SectionSession, Order: OrderSession, Text: in.SystemPrompt})
	secs = Override(secs, in.Sections)
	sort.SliceStable(secs, func(i, j int) bool { return secs[i].Order < secs[j].Order })
	return secs
}

func (a *Assembler) render(in Input, haveTools bool) (string, error) {
	vars := maps.Clone(a.cfg.Variables)
	if vars == nil {
		vars = map[string]string{}
	}
	vars["provider"], vars["model"], vars["cwd"] = in.Provider, in.Model, in.Cwd
	var parts []string
	for _, s := range a.sections(in, haveTools) {
		text := s.Text
		if !s.Literal {
			var err error
			if text, err = Render(s.Text, vars); err != nil {
				return "", fmt.Errorf("system prompt section %q: %w", s.Name, err)
			}
		}
		if strings.TrimSpace(text) != "" {
			parts = append(parts, text)
		}
	}
	return strings.Join(parts, "\n\n"), nil
}

// Override returns base with each of over replacing the same-named section
// in place, or appended when base has none of that name.
func Override(base, over []Section) []Section {
	out := slices.Clone(base)
	for _, o := range over {
		i := slices.IndexFunc(out, func(s Section) bool { return s.Name == o.Name })
		if i >= 0 {
			out[i] = o
		} else {
			out = append(out, o)
		}
	}
	return out
}

// orderTools applies the tool order; without one, tools are lexicographic.
func (a *Assembler) orderTools(tools []*llmv1.ToolSchema) ([]*llmv1.ToolSchema, error) {
	out := slices.Clone(tools)
	slices.SortStableFunc(out, func(x, y *llmv1.ToolSchema) int { return strings.Compare(x.GetName(), y.GetName()) })
	if len(a.cfg.ToolOrder) == 0 {
		return out, nil
	}
	byName := map[string]*llmv1.ToolSchema{}
	for _, t := range out {
		byName[t.GetName()] = t
	}
	listed := map[string]bool{}
	for _, n := range a.cfg.ToolOrder {
		if n == UnlistedTools {
			continue
		}
		if byName[n] == nil {
			return nil, fmt.Errorf("tool order names %q, which no visible toolhost serves", n)
		}
		listed[n] = true
	}
	ordered := make([]*llmv1.ToolSchema, 0, len(out))
	for _, n := range a.cfg.ToolOrder {
		if n != UnlistedTools {
			ordered = append(ordered, byName[n])
			continue
		}
		for _, t := range out {
			if !listed[t.GetName()] {
				ordered = append(ordered, t)
			}
		}
	}
	return ordered, nil
}

// Render interpolates {{name}} strictly: an unknown or valueless variable, or
// a malformed group (including a "{{" that opens no group while a "}}"
// follows), is an error; a lone "{{" with no later "}}" passes verbatim;
// substituted values are not re-scanned.
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
		if !varName().MatchString(name) {
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
