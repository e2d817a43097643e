package mcpbridge

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ResultBlocks maps MCP content to dsh result blocks:
//
//	text                      → text
//	image                     → image (inline data + mime type)
//	embedded text resource    → text "[resource <uri>]\n<text>"
//	embedded image blob       → image
//	other embedded blob       → extension "mcp/resource" {uri, mimeType, blob}
//	resource link             → text "[resource link <name>] <uri>"
//	audio                     → extension "mcp/audio" {mimeType, data}
//	anything else             → extension "mcp/<kind>" with its JSON
func ResultBlocks(content []mcp.Content) []*llmv1.ContentBlock {
	out := make([]*llmv1.ContentBlock, 0, len(content))
	for _, c := range content {
		out = append(out, resultBlock(c))
	}
	return out
}

func textBlock(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func extBlock(typ string, v any) *llmv1.ContentBlock {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{}`)
	}
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: typ, Json: string(b)}}}
}

func imageBlock(data []byte, mime string) *llmv1.ContentBlock {
	if mime == "" {
		mime = "application/octet-stream"
	}
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: data}, MimeType: mime}}}
}

func resultBlock(c mcp.Content) *llmv1.ContentBlock {
	switch v := c.(type) {
	case *mcp.TextContent:
		return textBlock(v.Text)
	case *mcp.ImageContent:
		return imageBlock(v.Data, v.MIMEType)
	case *mcp.AudioContent:
		return extBlock("mcp/audio", map[string]string{"mimeType": v.MIMEType, "data": base64.StdEncoding.EncodeToString(v.Data)})
	case *mcp.ResourceLink:
		name := v.Title
		if name == "" {
			name = v.Name
		}
		return textBlock(fmt.Sprintf("[resource link %s] %s", name, v.URI))
	case *mcp.EmbeddedResource:
		r := v.Resource
		if r == nil {
			return extBlock("mcp/resource", map[string]any{})
		}
		if r.Blob == nil {
			return textBlock(fmt.Sprintf("[resource %s]\n%s", r.URI, r.Text))
		}
		if strings.HasPrefix(r.MIMEType, "image/") {
			return imageBlock(r.Blob, r.MIMEType)
		}
		return extBlock("mcp/resource", map[string]string{"uri": r.URI, "mimeType": r.MIMEType, "blob": base64.StdEncoding.EncodeToString(r.Blob)})
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
