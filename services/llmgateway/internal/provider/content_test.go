package provider

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

func TestForModel(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		audience []string
		want     bool
	}{
		{nil, true},
		{[]string{"user"}, false},
		{[]string{"user", "user"}, false},
		{[]string{"assistant"}, true},
		{[]string{"user", "assistant"}, true},
	} {
		b := &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "x"}}}
		if tt.audience != nil {
			b.Annotations = &llmv1.ContentAnnotations{Audience: tt.audience}
		}
		if got := ForModel(b); got != tt.want {
			t.Errorf("ForModel(audience %v) = %v, want %v", tt.audience, got, tt.want)
		}
	}
}

func TestImageReason(t *testing.T) {
	t.Parallel()
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	for _, tt := range []struct {
		name string
		img  *llmv1.ImageBlock
		max  int
		want string // substring; "" means sendable
	}{
		{"png", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: png}, MimeType: "image/png"}, 0, ""},
		{"sniffed png", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: png}}, 0, ""},
		{"upper-case type", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: png}, MimeType: "IMAGE/PNG"}, 0, ""},
		{"http url", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://x/y.svg"}}, 0, ""},
		{"data url jpeg", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "data:image/jpeg;base64,/9j/"}}, 0, ""},
		{"svg", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte("<svg/>")}, MimeType: "image/svg+xml"}, 0, "image/svg+xml is not a format"},
		{"unknown bytes", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte{1, 2, 3}}}, 0, "format is unknown"},
		{"too big", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: png}, MimeType: "image/png"}, 8, "larger than the 8 bytes"},
		{"too big data url", &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}}, 8, "larger than"},
	} {
		got := ImageReason(tt.img, tt.max)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: ImageReason = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestPlaceholder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		b      *llmv1.ContentBlock
		reason string
		want   string
	}{
		{&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: make([]byte, 2048)}, MimeType: "image/png"}}}, "no vision",
			"[image (image/png, 2048 bytes) not sent: no vision]"},
		{&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://x/y.png"}}}}, "no vision",
			"[image https://x/y.png not sent: no vision]"},
		{&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: []byte("abc"), MimeType: "audio/wav"}}}, "no audio",
			"[audio (audio/wav, 3 bytes) not sent: no audio]"},
		{&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a.pdf", Name: "a", MimeType: "application/pdf", Content: &llmv1.DocumentBlock_Data{Data: []byte("%PDF")}}}}, "no pdf",
			`[document "a" file:///a.pdf (application/pdf, 4 bytes) not sent: no pdf]`},
		{&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Uri: "file:///big.log", Name: "big.log", Description: "the build log", MimeType: "text/plain", Size: proto.Int64(10)}}}, "",
			`[resource link "big.log" file:///big.log (text/plain, 10 bytes): the build log]`},
		{&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Uri: "memory://x"}}}, "",
			`[resource link memory://x]`},
	} {
		if got := Placeholder(tt.b, tt.reason); got != tt.want {
			t.Errorf("Placeholder = %q, want %q", got, tt.want)
		}
	}
}

func TestDocumentText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    *llmv1.DocumentBlock
		want string
		ok   bool
	}{
		{&llmv1.DocumentBlock{Content: &llmv1.DocumentBlock_Text{Text: "hi"}}, "hi", true},
		{&llmv1.DocumentBlock{MimeType: "application/json", Content: &llmv1.DocumentBlock_Data{Data: []byte(`{}`)}}, "{}", true},
		{&llmv1.DocumentBlock{MimeType: "text/plain", Content: &llmv1.DocumentBlock_Data{Data: []byte{0xff}}}, "", false},
		{&llmv1.DocumentBlock{MimeType: "application/pdf", Content: &llmv1.DocumentBlock_Data{Data: []byte("%PDF")}}, "", false},
		{&llmv1.DocumentBlock{MimeType: "text/plain"}, "", false},
	} {
		got, ok := DocumentText(tt.d)
		if got != tt.want || ok != tt.ok {
			t.Errorf("DocumentText(%v) = %q, %v", tt.d, got, ok)
		}
	}
}
