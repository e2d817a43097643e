package provider

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Content a route cannot carry is degraded when the request is built, never
// rejected: a session whose history holds an image (a tool's screenshot, a
// document, audio) must keep working on every route. The adapters decide per
// route what they can send as itself; everything else becomes a placeholder
// text naming it (Placeholder), so the model knows something was there.

// ForModel reports whether b is meant for the model: a block whose
// annotations name the user as its only audience is not sent.
func ForModel(b *llmv1.ContentBlock) bool {
	aud := b.GetAnnotations().GetAudience()
	if len(aud) == 0 {
		return true
	}
	for _, a := range aud {
		if a != "user" {
			return true
		}
	}
	return false
}

// EmptyToolResult is the text sent for a tool result with nothing to show
// the model; userOnly says its content was all for the user.
func EmptyToolResult(userOnly bool) string {
	if userOnly {
		return "(the tool's output is shown to the user only)"
	}
	return "(the tool returned no content)"
}

// imageTypes are the raster formats every vision API takes (OpenAI,
// Anthropic, vLLM/Ollama vision models).
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// ImageReason says why img cannot be sent to a route that takes images of
// up to maxBytes (0: no bound), or "" when it can. An inline image without
// a MIME type is sniffed (see ImageMIME).
func ImageReason(img *llmv1.ImageBlock, maxBytes int) string {
	mime, n := ImageMIME(img), imageSize(img)
	switch {
	case img.GetUrl() != "" && !strings.HasPrefix(img.GetUrl(), "data:"):
		return "" // fetched by the provider; its type is its business
	case !imageTypes[mime]:
		if mime == "" {
			return "its format is unknown"
		}
		return mime + " is not a format the model takes (png, jpeg, gif, webp)"
	case maxBytes > 0 && n > maxBytes:
		return fmt.Sprintf("larger than the %d bytes the route takes", maxBytes)
	}
	return ""
}

// ImageMIME is img's MIME type: the declared one, a data: URL's, or for
// inline bytes without one, what the bytes look like.
func ImageMIME(img *llmv1.ImageBlock) string {
	if mt := img.GetMimeType(); mt != "" {
		return strings.ToLower(mt)
	}
	if mt, _, ok := ParseDataURL(img.GetUrl()); ok {
		return strings.ToLower(mt)
	}
	if d := img.GetData(); len(d) > 0 {
		if mt := http.DetectContentType(d); strings.HasPrefix(mt, "image/") {
			return mt
		}
	}
	return ""
}

// ParseDataURL splits "data:<mime>;base64,<data>".
func ParseDataURL(u string) (mime, data string, ok bool) {
	rest, found := strings.CutPrefix(u, "data:")
	if !found {
		return "", "", false
	}
	meta, data, found := strings.Cut(rest, ",")
	if !found {
		return "", "", false
	}
	mime, found = strings.CutSuffix(meta, ";base64")
	return mime, data, found
}

func imageSize(img *llmv1.ImageBlock) int {
	if _, data, ok := ParseDataURL(img.GetUrl()); ok {
		return base64.StdEncoding.DecodedLen(len(data))
	}
	return len(img.GetData())
}

// DocumentText returns a document's content as text when it has text, or
// bytes that are valid UTF-8 under a textual MIME type.
func DocumentText(d *llmv1.DocumentBlock) (string, bool) {
	if t, ok := d.GetContent().(*llmv1.DocumentBlock_Text); ok {
		return t.Text, true
	}
	data := d.GetData()
	if data == nil || !textual(d.GetMimeType()) || !utf8.Valid(data) {
		return "", false
	}
	return string(data), true
}

func textual(mime string) bool {
	mime = strings.ToLower(mime)
	return strings.HasPrefix(mime, "text/") || strings.HasSuffix(mime, "+json") || strings.HasSuffix(mime, "+xml") ||
		mime == "application/json" || mime == "application/xml" || mime == "application/yaml" ||
		mime == "application/x-yaml" || mime == "application/javascript" || mime == "application/toml"
}

// DocumentHeading is the line that introduces a document sent as text.
func DocumentHeading(d *llmv1.DocumentBlock) string {
	return "[document" + describeAttrs(d.GetName(), d.GetUri(), d.GetMimeType(), -1) + "]"
}

// Placeholder is the text sent instead of a block the route cannot carry:
// its kind, name, URI, MIME type and size, and why it is not there. With
// reason "" it is the plain description (a resource link, which is only ever
// a reference).
func Placeholder(b *llmv1.ContentBlock, reason string) string {
	var kind, attrs string
	switch v := b.GetBlock().(type) {
	case *llmv1.ContentBlock_Image:
		u := v.Image.GetUrl()
		size := imageSize(v.Image)
		if strings.HasPrefix(u, "data:") {
			u = ""
		} else if u != "" {
			size = -1
		}
		kind, attrs = "image", describeAttrs("", u, ImageMIME(v.Image), size)
	case *llmv1.ContentBlock_Audio:
		kind, attrs = "audio", describeAttrs("", "", v.Audio.GetMimeType(), len(v.Audio.GetData()))
	case *llmv1.ContentBlock_Document:
		d := v.Document
		size := len(d.GetData())
		if t, ok := d.GetContent().(*llmv1.DocumentBlock_Text); ok {
			size = len(t.Text)
		}
		kind, attrs = "document", describeAttrs(d.GetName(), d.GetUri(), d.GetMimeType(), size)
	case *llmv1.ContentBlock_ResourceLink:
		l := v.ResourceLink
		size := -1
		if l.Size != nil {
			size = int(l.GetSize())
		}
		kind, attrs = "resource link", describeAttrs(l.GetName(), l.GetUri(), l.GetMimeType(), size)
		if d := l.GetDescription(); d != "" {
			attrs += ": " + d
		}
	case *llmv1.ContentBlock_Extension:
		kind = v.Extension.GetType() + " block"
	default:
		kind = "block"
	}
	if reason == "" {
		return "[" + kind + attrs + "]"
	}
	return "[" + kind + attrs + " not sent: " + reason + "]"
}

// describeAttrs renders ` "name" <uri> (mime, N bytes)`; empty parts and a
// negative size are left out.
func describeAttrs(name, uri, mime string, size int) string {
	var sb strings.Builder
	if name != "" {
		fmt.Fprintf(&sb, " %q", name)
	}
	if uri != "" {
		sb.WriteString(" " + uri)
	}
	switch {
	case mime != "" && size >= 0:
		fmt.Fprintf(&sb, " (%s, %d bytes)", mime, size)
	case mime != "":
		sb.WriteString(" (" + mime + ")")
	case size >= 0:
		fmt.Fprintf(&sb, " (%d bytes)", size)
	}
	return sb.String()
}
