package workspace

import (
	"context"
	"errors"
	"fmt"
	"html"
	"strings"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// SkillToolName is the name of the skill tool.
const SkillToolName = "skill"

// SkillArgs are the skill tool's parameters.
type SkillArgs struct {
	Name string `json:"name" jsonschema:"required,description=The skill's name as listed in the skill catalog."`
}

// Tool-result error codes of the skill tool.
const (
	CodeUnknownSkill = "UNKNOWN_SKILL"
	CodeSkillRefused = "SKILL_NOT_MODEL_INVOCABLE"
	CodeBadCwd       = "CWD_OUTSIDE_WORKSPACE"
)

// Tool returns the skill tool: it loads a skill of the calling session's cwd
// and returns its instructions in the §7.8 format. bounds is the call's
// confinement (nil: the host's root): the cwd, its project root and the
// project's skills must all lie inside it.
func (r *Reader) Tool(bounds func(*toolsdk.Call) (Bounds, error)) toolsdk.Tool {
	run := func(_ context.Context, call *toolsdk.Call, a SkillArgs) (toolsdk.Result, error) {
		var b Bounds
		if bounds != nil {
			var err error
			if b, err = bounds(call); err != nil {
				return toolsdk.Result{}, err
			}
		}
		s, err := r.LoadSkill(b, call.Cwd, a.Name)
		if err != nil {
			return toolsdk.Result{}, err
		}
		return toolsdk.Text(FormatSkill(s)), nil
	}
	return toolsdk.Define(SkillToolName,
		"Load a skill from the skill catalog by name: returns the skill's instructions and where its resources live. Use it when a task matches a skill's description.",
		run,
		toolsdk.AlwaysConcurrencySafe(),
		toolsdk.PresentCall(func(a SkillArgs) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{
				Title: "Load skill " + a.Name, Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_READ,
			}}}
		}),
	)
}

// LoadSkill returns the named skill of cwd's catalog, confined to b (empty:
// the host's root), refusing unknown skills and those that disable model
// invocation.
func (r *Reader) LoadSkill(b Bounds, cwd, name string) (*Skill, error) {
	r, cwd, err := r.at(b, cwd)
	if err != nil {
		if errors.Is(err, ErrOutside) {
			return nil, toolsdk.Errorf(CodeBadCwd, "%v", err)
		}
		return nil, err
	}
	c := r.catalog(r.projectRoot(cwd))
	s := c.find(name)
	if s == nil {
		var names []string
		for _, k := range c.skills {
			if !k.Summary.GetDisableModelInvocation() {
				names = append(names, k.Summary.GetName())
			}
		}
		avail := "none"
		if len(names) > 0 {
			avail = strings.Join(names, ", ")
		}
		return nil, toolsdk.Errorf(CodeUnknownSkill, "unknown skill %q; available skills: %s", name, avail)
	}
	if s.Summary.GetDisableModelInvocation() {
		return nil, toolsdk.Errorf(CodeSkillRefused, "skill %q is only for humans to invoke (disable-model-invocation)", name)
	}
	return s, nil
}

// FormatSkill renders a loaded skill for the model (semantics.md §7.8).
func FormatSkill(s *Skill) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<skill_content name=\"%s\">\n", html.EscapeString(s.Summary.GetName()))
	b.WriteString("<skill_resources>\n")
	switch k := s.Summary.GetResourceBase().GetKind().(type) {
	case *toolsv1.SkillResourceBase_Directory:
		fmt.Fprintf(&b, "Base directory: %s\nRelative paths in the instructions resolve against it.\n", k.Directory)
	case *toolsv1.SkillResourceBase_Url:
		fmt.Fprintf(&b, "Base URL: %s\n", k.Url)
	case *toolsv1.SkillResourceBase_Opaque:
		b.WriteString(k.Opaque + "\n")
	default:
		b.WriteString("None.\n")
	}
	b.WriteString("</skill_resources>\n<skill_instructions>\n")
	b.WriteString(strings.TrimRight(s.Body, "\n"))
	b.WriteString("\n</skill_instructions>\n</skill_content>")
	return b.String()
}
