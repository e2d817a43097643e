package mcpbridge

import (
	"encoding/json"
	"slices"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ResultBlocks maps MCP content to dsh result blocks, annotations kept
// (audience, priority):
//
//	text                      → text
//	image                     → image (inline data + mime type)
//	audio                     → audio
//	embedded image blob       → image (models that see images see it)
//	other embedded resource   → document {uri, mime type, text or data}
//	resource link             → resource_link {uri, name, description, mime type, size}
//	anything else             → extension "mcp/<kind>" with its JSON
func ResultBlocks(content []mcp.Content) []*llmv1.ContentBlock {
	out := make([]*llmv1.ContentBlock, 0, len(content))
	for _, c := range content {
		out = append(out, resultBlock(c))
	}
	return out
}

// userOnlyNote replaces a result whose every block is for the user only, so
// the model is not left guessing at "(no output)".
const userOnlyNote = "(the tool's output was shown to the user only)"

// mapResult is the result of a successful call. Blocks whose audience is
// the user only are not sent to the model: they go to the result's view
// (a generic card of every block), which clients render and the model
// never sees.
func mapResult(content []mcp.Content, structured any) toolsdk.Result {
	all := ResultBlocks(content)
	var model []*llmv1.ContentBlock
	for _, b := range all {
		if !UserOnly(b) {
			model = append(model, b)
		}
	}
	r := toolsdk.Result{Content: model}
	if len(model) < len(all) {
		if len(model) == 0 {
			r.Content = []*llmv1.ContentBlock{toolsdk.TextBlock(userOnlyNote)}
		}
		r.View = &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Content: all}}}
	}
	if structured != nil {
		r.Meta = map[string]any{"structuredContent": structured}
	}
	return r
}

// UserOnly reports whether a block's audience names the user and not the
// model ("assistant").
func UserOnly(b *llmv1.ContentBlock) bool {
	a := b.GetAnnotations().GetAudience()
	return slices.Contains(a, string(mcp.Role("user"))) && !slices.Contains(a, "assistant")
}

func annotations(a *mcp.Annotations) *llmv1.ContentAnnotations {
	if a == nil || (len(a.Audience) == 0 && a.Priority == 0) {
		return nil
	}
	out := &llmv1.ContentAnnotations{}
	for _, r := range a.Audience {
		out.Audience = append(out.Audience, string(r))
	}
	if a.Priority != 0 {
		p := a.Priority
		out.Priority = &p
	}
	return out
}

func imageBlock(data []byte, mime string) *llmv1.ContentBlock {
	if mime == "" {
		mime = "application/octet-stream"
	}
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: data}, MimeType: mime}}}
}

// documentBlock maps resource contents (embedded, or read with
// resources/read) to a block.
func documentBlock(r *mcp.ResourceContents) *llmv1.ContentBlock {
	if r.Blob != nil && strings.HasPrefix(r.MIMEType, "image/") {
		return imageBlock(r.Blob, r.MIMEType)
	}
	d := &llmv1.DocumentBlock{Uri: r.URI, MimeType: r.MIMEType}
	if r.Blob != nil {
		d.Content = &llmv1.DocumentBlock_Data{Data: r.Blob}
	} else {
		d.Content = &llmv1.DocumentBlock_Text{Text: r.Text}
	}
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: d}}
}

func resultBlock(c mcp.Content) *llmv1.ContentBlock {
	switch v := c.(type) {
	case *mcp.TextContent:
		b := toolsdk.TextBlock(v.Text)
		b.Annotations = annotations(v.Annotations)
		return b
	case *mcp.ImageContent:
		b := imageBlock(v.Data, v.MIMEType)
		b.Annotations = annotations(v.Annotations)
		return b
	case *mcp.AudioContent:
		mime := v.MIMEType
		if mime == "" {
			mime = "application/octet-stream"
		}
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: v.Data, MimeType: mime}}, Annotations: annotations(v.Annotations)}
	case *mcp.ResourceLink:
		name := v.Title
		if name == "" {
			name = v.Name
		}
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{
			Uri: v.URI, Name: name, Description: v.Description, MimeType: v.MIMEType, Size: v.Size,
		}}, Annotations: annotations(v.Annotations)}
	case *mcp.EmbeddedResource:
		if v.Resource == nil || v.Resource.URI == "" {
			return toolsdk.TextBlock("[an embedded resource without a uri]")
		}
		b := documentBlock(v.Resource)
		b.Annotations = annotations(v.Annotations)
		return b
	default:
		b, err := json.Marshal(c)
		if err != nil {
			b = []byte(`{}`)
		}
		var kind struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(b, &kind)
		if kind.Type == "" {
			kind.Type = "unknown"
		}
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "mcp/" + kind.Type, Json: string(b)}}}
	}
}

// errorText is the message of an isError result: its text blocks joined,
// other blocks named, so the model sees "Error: <message>".
func errorText(content []mcp.Content) string {
	var parts []string
	for _, b := range ResultBlocks(content) {
		switch v := b.GetBlock().(type) {
		case *llmv1.ContentBlock_Text:
			parts = append(parts, v.Text.GetText())
		case *llmv1.ContentBlock_Image:
			parts = append(parts, "[image]")
		case *llmv1.ContentBlock_Audio:
			parts = append(parts, "[audio]")
		case *llmv1.ContentBlock_Document:
			parts = append(parts, "[resource "+v.Document.GetUri()+"]")
		case *llmv1.ContentBlock_ResourceLink:
			parts = append(parts, "[resource link "+v.ResourceLink.GetUri()+"]")
		case *llmv1.ContentBlock_Extension:
			parts = append(parts, "["+v.Extension.GetType()+"]")
		}
	}
	msg := strings.TrimPrefix(strings.Join(parts, "\n"), "Error: ")
	if msg == "" {
		msg = "the MCP tool reported an error without a message"
	}
	return msg
}
