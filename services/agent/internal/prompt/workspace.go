package prompt

import (
	"fmt"
	"strings"
	"unicode/utf8"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// CatalogDescriptionMaxLength bounds one skill description in the catalog
// (in characters).
const CatalogDescriptionMaxLength = 500

// Instructions renders the workspace instruction files as the text of the
// workspace section ("" when there are none). The files are quoted, never
// interpolated.
func Instructions(ws *toolsv1.GetWorkspaceContextResponse) string {
	files := ws.GetInstructions()
	if len(files) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("# Workspace instructions\n\nThese instruction files from the workspace apply to your work (outermost first; a deeper file refines the ones above it).")
	for _, f := range files {
		fmt.Fprintf(&b, "\n\n<instructions path=%q>\n%s\n</instructions>", f.GetPath(), strings.TrimRight(f.GetContent(), "\n"))
		if f.GetTruncated() {
			fmt.Fprintf(&b, "\n(%s was truncated: %d of %d bytes shown; read the file for the rest.)", f.GetPath(), len(f.GetContent()), f.GetSizeBytes())
		}
	}
	return b.String()
}

var xmlText = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// Catalog renders the skill catalog reminder: the skills the model may load,
// sorted by name, with XML-escaped descriptions bounded by
// CatalogDescriptionMaxLength; no bodies, no paths. "" when there are none.
func Catalog(ws *toolsv1.GetWorkspaceContextResponse) string {
	var lines []string
	for _, s := range ws.GetSkills() {
		if s.GetDisableModelInvocation() {
			continue
		}
		d := s.GetDescription()
		if w := s.GetWhenToUse(); w != "" {
			d += " When to use: " + w
		}
		d = strings.Join(strings.Fields(d), " ")
		if utf8.RuneCountInString(d) > CatalogDescriptionMaxLength {
			d = string([]rune(d)[:CatalogDescriptionMaxLength-1]) + "…"
		}
		lines = append(lines, fmt.Sprintf("- %s: %s", s.GetName(), xmlText.Replace(d)))
	}
	if len(lines) == 0 {
		return ""
	}
	return "<system-reminder>\nThese skills are available. When a task matches a skill's description, load it with the skill tool (skill {\"name\": \"<name>\"}) before starting, then follow its instructions.\n\n" +
		strings.Join(lines, "\n") + "\n</system-reminder>"
}

// CatalogPrefix is the session prefix carrying the catalog: one user-role
// message, or nil without skills.
func CatalogPrefix(ws *toolsv1.GetWorkspaceContextResponse) []*llmv1.Message {
	c := Catalog(ws)
	if c == "" {
		return nil
	}
	return []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{session.Text(c)}}}
}
