package chat

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"unsafe"

	json "github.com/segmentio/encoding/json"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

// marshalBody is the encoding Body used before encode.go: json.Marshal of
// the wire form, the schema as a json.RawMessage. encode must write the
// same bytes.
func marshalBody(w wireRequest) ([]byte, error) {
	w.Tools = append([]wireTool(nil), w.Tools...)
	for i := range w.Tools {
		w.Tools[i].Function.Parameters = json.RawMessage(w.Tools[i].Function.ParamsText)
	}
	return json.Marshal(&w)
}

// adapters are the dialects' differences that reach the body.
func encodeAdapters() map[string]*Adapter {
	return map[string]*Adapter{
		"deepseek": New(Dialect{Kind: "deepseek", ReasoningPassback: true}, Config{Route: "deepseek", Thinking: "enabled", ReasoningEffort: "high"}),
		"openai":   New(Dialect{Kind: "openai", Images: true, MaxCompletionTokens: true}, Config{Route: "openai"}),
		"text":     New(Dialect{Kind: "openai"}, Config{Route: "text", NoImages: true}),
	}
}

// sameBody checks that encode writes exactly what json.Marshal wrote for
// req on every dialect (or fails where it failed).
func sameBody(t *testing.T, req *llmv1.GenerateRequest) {
	t.Helper()
	for name, a := range encodeAdapters() {
		w, _ := a.wire(req, 0, true)
		want, wantErr := marshalBody(w)
		got, err := a.encode(&w)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%s: encode error %v, json.Marshal error %v", name, err, wantErr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("%s: encode differs from json.Marshal:\n got %s\nwant %s", name, got, want)
		}
		if err == nil && !json.Valid(got) {
			t.Fatalf("%s: not JSON: %s", name, got)
		}
		if err == nil {
			sameContinuedBody(t, name, a, req)
		}
	}
}

// slot is a provider.BodyCache holding one body.
type slot struct{ prev, kept *provider.BodyPrefix }

func (s *slot) Prev() *provider.BodyPrefix  { return s.prev }
func (s *slot) Keep(b *provider.BodyPrefix) { s.kept = b }

// The tools of the request a continued one continues: their own copies
// (equal schemas, other pointers: encoded again), the very same schemas
// (same_tools: their kept encoding reused), other schemas, or none.
const (
	toolsCloned = iota
	toolsShared
	toolsOther
	toolsNone
)

// sameContinuedBody checks that a request continuing its first k messages
// (for every k, after a body another adapter made, with its tools cloned,
// shared, different or absent) gets exactly the body and dropped count of
// the whole request, and so does the request continuing it in turn.
func sameContinuedBody(t *testing.T, name string, a *Adapter, req *llmv1.GenerateRequest) {
	t.Helper()
	want, wantDropped, err := a.Body(req)
	if err != nil {
		t.Fatal(err)
	}
	// The reference: the encoding kept when no body was remembered.
	fresh := &slot{}
	if _, _, err := a.body(req, fresh); err != nil {
		t.Fatal(err)
	}
	other := New(Dialect{Kind: "openai"}, Config{Route: "other"})
	otherTools := []*llmv1.ToolSchema{{Name: "other", Description: "<&>", Parameters: `{"type":"object"}`}}
	for k := 0; k <= len(req.GetMessages()); k++ {
		for _, owner := range []*Adapter{a, other} {
			for tools := range toolsNone + 1 {
				first := proto.CloneOf(req)
				first.Messages = req.Messages[:k]
				switch tools {
				case toolsShared:
					first.Tools = req.Tools
				case toolsOther:
					first.Tools = otherTools
				case toolsNone:
					first.Tools = nil
				}
				s := &slot{}
				if _, _, err := owner.body(first, s); err != nil {
					t.Fatal(err)
				}
				// (Reused only by their owner: body checks that apart.)
				same := tools == toolsShared && len(req.Tools) > 0
				if same != s.kept.SameTools(req.Tools) {
					t.Fatalf("%s: kept tools of %d messages (owner %s, tools case %d) the same %v, want %v", name, k, owner.cfg.Route, tools, !same, same)
				}
				// The continued request, then the one continuing it with
				// the same tools (their encoding kept from a reused one).
				for range 2 {
					s.prev, s.kept = s.kept, nil
					parts, dropped, err := a.body(req, s)
					if err != nil {
						t.Fatal(err)
					}
					got := bytes.Join(parts, nil)
					// The remembered messages and tools are sent as they
					// are, not copied: each is one of the body's parts.
					if s.prev.Owner == a && s.prev.N <= len(req.GetMessages()) {
						for _, seg := range s.prev.Segments {
							if !hasPart(parts, seg) {
								t.Fatalf("%s: continuing %d messages: the remembered part %q is not one of the body's parts", name, k, seg)
							}
						}
						if s.prev.SameTools(req.Tools) && !hasPart(parts, s.prev.ToolBytes) {
							t.Fatalf("%s: continuing %d messages: the remembered tools are not one of the body's parts", name, k)
						}
					}
					for i, p := range parts {
						if len(p) == 0 {
							t.Fatalf("%s: part %d of the body is empty", name, i)
						}
					}
					if !bytes.Equal(got, want) || dropped != wantDropped {
						t.Fatalf("%s: continuing %d messages (owner %s, tools case %d): body differs (dropped %d, want %d):\n got %s\nwant %s", name, k, owner.cfg.Route, tools, dropped, wantDropped, got, want)
					}
					if s.kept == nil || s.kept.N != len(req.GetMessages()) || s.kept.Owner != a {
						t.Fatalf("%s: kept %+v", name, s.kept)
					}
					if len(req.Tools) > 0 && (!s.kept.SameTools(req.Tools) || !bytes.Contains(got, s.kept.ToolBytes)) {
						t.Fatalf("%s: kept tools %q, not those of the body %s", name, s.kept.ToolBytes, got)
					}
					// The kept messages are exactly those kept when no body
					// was remembered.
					if kept, ref := bytes.Join(s.kept.Segments, nil), bytes.Join(fresh.kept.Segments, nil); !bytes.Equal(kept, ref) {
						t.Fatalf("%s: kept messages %q, want %q", name, kept, ref)
					}
					// Kept messages or tools are slices of a buffer this
					// body (or the remembered one, the same bytes) was
					// encoded in, which they keep alive: counted as all of
					// it. (Its spare capacity too, by construction: Held
					// adds the buffer's cap, not the body's length; the
					// parts are cut to their lengths, so only the length
					// can be checked here.)
					if s.kept.Len()+len(s.kept.ToolBytes) > 0 && s.kept.HeldBytes() < len(got) {
						t.Fatalf("%s: kept %d bytes counted as %d, but they keep the %d-byte body alive", name, s.kept.Len(), s.kept.HeldBytes(), len(got))
					}
				}
			}
		}
	}
}

// hasPart reports whether part is one of parts: the same bytes in memory,
// not a copy.
func hasPart(parts [][]byte, part []byte) bool {
	for _, p := range parts {
		if len(p) == len(part) && len(p) > 0 && &p[0] == &part[0] {
			return true
		}
	}
	return false
}

// loadBody is the wire form of the load benchmark's request
// (testdata/load_request.json: the body the gateway sent for it).
func loadBody(t *testing.T) wireRequest {
	t.Helper()
	raw, err := os.ReadFile("../../testdata/load_request.json")
	if err != nil {
		t.Fatal(err)
	}
	var body wireRequest
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	for i := range body.Tools {
		body.Tools[i].Function.ParamsText = string(body.Tools[i].Function.Parameters)
		body.Tools[i].Function.Parameters = nil
	}
	return body
}

// TestEncodeLoad: the load benchmark's request (system prompt, 17 tool
// schemas, 5 tool calls and results) and the rich-content request encode
// byte for byte as before, every time (the schema memo is warm the second
// time).
func TestEncodeLoad(t *testing.T) {
	t.Parallel()
	body := loadBody(t)
	for name, a := range encodeAdapters() {
		for range 2 {
			want, err := marshalBody(body)
			if err != nil {
				t.Fatal(err)
			}
			got, err := a.encode(&body)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: encode differs from json.Marshal:\n got %s\nwant %s", name, got, want)
			}
		}
	}
	sameBody(t, providertest.RichContentRequest("openai", "m"))
}

var encodeSeeds = []string{
	"", "plain", "<script>&amp;</script>", "line\nbreak\ttab\r\"quote\"\\", "\u2028\u2029", "\x00\x01\x1f\x7f",
	"caf\u00e9 \U0001F600", "bad \xff\xfe utf8", "\xe2\x80", `{"type":"object","properties":{"a":{"type":"string","description":"<b>&</b>\u2028"}}}`,
	" { \"a\" : [ 1 , 2.50 , true , null ] } ", `{"a":1}{"b":2}`, `{"a":}`, `null`, `[1]`,
}

// FuzzEncode: for any request text (escapes, HTML, invalid UTF-8, line
// separators, any schema text), encode writes exactly json.Marshal's bytes.
func FuzzEncode(f *testing.F) {
	for i, s := range encodeSeeds {
		f.Add(s, encodeSeeds[(i+1)%len(encodeSeeds)], encodeSeeds[(i+9)%len(encodeSeeds)], 0.7, int32(i), uint8(i))
		// With tools (strict on every other one).
		f.Add(s, encodeSeeds[(i+3)%len(encodeSeeds)], encodeSeeds[(i+9)%len(encodeSeeds)], 0.7, int32(i), uint8(i)|16|uint8(32*(i&1)))
	}
	f.Fuzz(func(t *testing.T, text, other, schema string, temp float64, maxTokens int32, flags uint8) {
		tb := func(s string) *llmv1.ContentBlock {
			return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
		}
		req := &llmv1.GenerateRequest{Model: other, Messages: []*llmv1.Message{
			{Role: llmv1.Role_ROLE_SYSTEM, Content: []*llmv1.ContentBlock{tb(text)}},
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{tb(text), tb(other)}},
			{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{
				tb(other),
				{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: text}}},
				{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: other, Name: text, Arguments: schema}}},
			}},
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: other, Content: []*llmv1.ContentBlock{tb(text)}}}},
				{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://example.com/" + text}}}},
				tb(other),
			}},
		}}
		if flags&1 != 0 {
			req.System = &text
		}
		if flags&2 != 0 {
			req.Temperature = &temp
		}
		if flags&4 != 0 {
			req.MaxTokens = &maxTokens
		}
		if flags&8 != 0 {
			req.Stop = []string{text, other}
		}
		if flags&16 != 0 {
			req.Tools = []*llmv1.ToolSchema{{Name: text, Description: other, Parameters: schema, Strict: flags&32 != 0}, {Name: other}}
		}
		sameBody(t, req)
	})
}

// TestEncodeSizeHint: the load benchmark's body fits the buffer encode
// sizes for it, so it is allocated once and never grown.
func TestEncodeSizeHint(t *testing.T) {
	t.Parallel()
	body := loadBody(t)
	a := encodeAdapters()["openai"]
	got, err := a.encode(&body)
	if err != nil {
		t.Fatal(err)
	}
	if n := sizeHint(&body); len(got) > n+n/8+256 {
		t.Errorf("body of %d bytes outgrew its buffer (hint %d)", len(got), n)
	}
}

// TestLongConversationCompacts: a conversation continued one step at a
// time, far past maxSegments steps, with the very same tools throughout,
// gets the whole request's body at every step; its kept encoding never has
// more than maxSegments parts, and a compaction leaves one buffer holding
// the messages and the tools (the earlier steps' buffers released).
func TestLongConversationCompacts(t *testing.T) {
	t.Parallel()
	load := providertest.LoadRequest(t, "../../testdata/load_request.json")
	a := encodeAdapters()["openai"]
	msgs := longConversation(load, 3*maxSegments+5)
	s := &slot{}
	compactions := 0
	for n := 1; n <= len(msgs); n += 2 {
		req := &llmv1.GenerateRequest{Model: load.Model, System: load.System, Tools: load.Tools, Messages: msgs[:n]}
		want := continueStep(t, a, s, req)
		k := s.kept
		if len(k.Segments) > maxSegments {
			t.Fatalf("%d messages: kept in %d parts, want at most %d", n, len(k.Segments), maxSegments)
		}
		if !k.SameTools(load.Tools) || !bytes.Contains(want, k.ToolBytes) || k.Held < k.Len()+len(k.ToolBytes) {
			t.Fatalf("%d messages: kept tools %d bytes and messages %d, held %d", n, len(k.ToolBytes), k.Len(), k.Held)
		}
		// A step adds at most one part: fewer parts than the step before
		// is a compaction.
		if s.prev != nil && len(k.Segments) < len(s.prev.Segments) {
			compactions++
			// one buffer of exactly the messages and the tools: a new
			// copy of the tools right after the messages
			if len(k.Segments) != 1 || k.Held != k.Len()+len(k.ToolBytes) {
				t.Fatalf("%d messages: compacted to %d parts, %d bytes held for %d of messages and %d of tools", n, len(k.Segments), k.Held, k.Len(), len(k.ToolBytes))
			}
			msgs := unsafe.Pointer(unsafe.SliceData(k.Segments[0]))
			if &k.ToolBytes[0] == &s.prev.ToolBytes[0] || unsafe.Pointer(unsafe.SliceData(k.ToolBytes)) != unsafe.Add(msgs, len(k.Segments[0])) {
				t.Fatalf("%d messages: compacted, but the tools are not copied right after the messages", n)
			}
		}
	}
	if compactions < 2 {
		t.Fatalf("%d compactions in %d steps, want at least 2", compactions, len(msgs)/2)
	}
}

// TestLongConversationHeldBounded: a conversation continued one step at a
// time whose steps' buffers are mostly not the kept messages (a long system
// prompt; the tools encoded again at every step, not the very same
// schemas) keeps no more alive than a small multiple of its body once it
// is maxSegments steps long: the parts are compacted before maxSegments
// steps' buffers add up. (Measured over these 69 steps: at most 1.8x,
// 2.0x and 2.4x the body; 3.3x, 3.8x and 5.8x when only the number of
// parts was bounded.)
func TestLongConversationHeldBounded(t *testing.T) {
	t.Parallel()
	load := providertest.LoadRequest(t, "../../testdata/load_request.json")
	a := encodeAdapters()["openai"]
	msgs := longConversation(load, 2*maxSegments+5)
	longSystem := strings.Repeat("You are a careful assistant. ", 10<<10/29)
	for _, tc := range []struct {
		name   string
		system string
		cloned bool
	}{
		{"long system prompt", longSystem, false},
		{"tools not reused", load.GetSystem(), true},
		{"both", longSystem, true},
	} {
		s := &slot{}
		for n := 1; n <= len(msgs); n += 2 {
			req := &llmv1.GenerateRequest{Model: load.Model, System: &tc.system, Tools: load.Tools, Messages: msgs[:n]}
			if tc.cloned {
				req.Tools = proto.CloneOf(&llmv1.GenerateRequest{Tools: load.Tools}).Tools
			}
			want := continueStep(t, a, s, req)
			k := s.kept
			if step := n / 2; step >= maxSegments && k.Held > 3*len(want) {
				t.Errorf("%s, step %d: kept %d bytes of messages and %d of tools hold %d bytes alive, %.2fx the %d-byte body", tc.name, step, k.Len(), len(k.ToolBytes), k.Held, float64(k.Held)/float64(len(want)), len(want))
				break
			}
		}
	}
}

// TestRepeatedContinuationHoldsNothingMore: a request continued again and
// again with no new message and the very same tools sends its whole body
// each time but keeps nothing more alive: the kept encoding stays the
// first one's.
func TestRepeatedContinuationHoldsNothingMore(t *testing.T) {
	t.Parallel()
	load := providertest.LoadRequest(t, "../../testdata/load_request.json")
	a := encodeAdapters()["openai"]
	s := &slot{}
	continueStep(t, a, s, load)
	first := s.kept
	for i := range 2 * maxSegments {
		continueStep(t, a, s, load)
		if s.kept.Held != first.Held || len(s.kept.Segments) != len(first.Segments) {
			t.Fatalf("repeat %d: kept %d parts holding %d bytes, the first kept %d holding %d", i, len(s.kept.Segments), s.kept.Held, len(first.Segments), first.Held)
		}
	}
}

// longConversation is the load request's first message and then its
// other messages again and again: at least steps two-message steps.
func longConversation(load *llmv1.GenerateRequest, steps int) []*llmv1.Message {
	msgs := load.Messages[:1:1] // appends go to a new array, never load's
	for len(msgs) < 2*steps {
		msgs = append(msgs, load.Messages[1:]...)
	}
	return msgs
}

// continueStep encodes req continuing the body s kept (the kept one
// becoming the remembered one), checks it is the whole request's body and
// dropped count, and returns that body.
func continueStep(t *testing.T, a *Adapter, s *slot, req *llmv1.GenerateRequest) []byte {
	t.Helper()
	want, wantDropped, err := a.Body(req)
	if err != nil {
		t.Fatal(err)
	}
	s.prev, s.kept = s.kept, nil
	parts, dropped, err := a.body(req, s)
	if err != nil {
		t.Fatal(err)
	}
	if got := bytes.Join(parts, nil); !bytes.Equal(got, want) || dropped != wantDropped {
		t.Fatalf("%d messages: body differs (dropped %d, want %d)", len(req.GetMessages()), dropped, wantDropped)
	}
	return want
}
