package session

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// richBlocks holds every content-block type a tool or a user can produce,
// with and without annotations.
func richBlocks() []*llmv1.ContentBlock {
	return []*llmv1.ContentBlock{
		Text("see below"),
		{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte("\x89PNG\r\n")}, MimeType: "image/png"}}},
		{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://example.com/a.jpg"}}}},
		{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: []byte("RIFF\x00\x01"), MimeType: "audio/wav"}}},
		{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///notes.md", MimeType: "text/markdown", Name: "notes.md", Content: &llmv1.DocumentBlock_Text{Text: "# Notes\n\"quoted\" é"}}}},
		{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a.pdf", MimeType: "application/pdf", Content: &llmv1.DocumentBlock_Data{Data: []byte("%PDF-1.7\x00\xff")}}}},
		{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Uri: "memory://graph", Name: "graph", Description: "the graph", MimeType: "application/json", Size: proto.Int64(0)}}},
		{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "progress"}}, Annotations: &llmv1.ContentAnnotations{Audience: []string{"user"}}},
		{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "important"}}, Annotations: &llmv1.ContentAnnotations{Audience: []string{"user", "assistant"}, Priority: proto.Float64(0)}},
	}
}

// TestGoldenRichContent: the event JSON of tool results and user messages
// holding audio, documents, resource links and annotations is stable
// (golden), passes the kernel's per-event rules (what a store checks before
// writing) and decodes to the very same events (a zero size and a zero
// priority survive as set). The NATS payload is the binary protobuf of the
// same message.
func TestGoldenRichContent(t *testing.T) {
	t.Parallel()
	evs := []*sessionv1.SessionEvent{
		ToolResultEvent(1, 1, "c1", richBlocks(), false, nil, 3),
		UserMessageEvent(richBlocks(), UserSource()),
	}
	var out bytes.Buffer
	for i, ev := range evs {
		ev.Seq, ev.Time = int64(i+4), 1700000000000+int64(i)
		if err := ValidateEvent(ev); err != nil {
			t.Errorf("event %d: ValidateEvent = %v", i, err)
		}
		b, err := MarshalEventJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		back, err := UnmarshalEventJSON(b)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(ev, back) {
			t.Errorf("event %d does not round-trip:\n%s", i, b)
		}
		out.Write(b)
		out.WriteByte('\n')
	}
	golden(t, "rich_content.events.jsonl", out.Bytes())
}
