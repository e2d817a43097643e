package prefix

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
)

// referenceID is the id as the package doc defines it, each hash with a
// digest of its own: SHA-256 over the chain of the messages' deterministic
// encodings seeded with the tenant, the system prompt's hash and the
// tools' hash.
func referenceID(t testing.TB, tenant string, msgs []*llmv1.Message, system *string, tools []*llmv1.ToolSchema) string {
	t.Helper()
	opts := proto.MarshalOptions{Deterministic: true}
	h := sha256.Sum256([]byte("dsh.llm.v1 prefix\x00" + tenant))
	for _, m := range msgs {
		b, err := opts.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		h = sha256.Sum256(append(h[:], b...))
	}
	var sys []byte
	if system != nil {
		sys = append([]byte{1}, *system...)
	}
	sysH := sha256.Sum256(sys)
	var tb []byte
	for _, tool := range tools {
		b, err := opts.Marshal(tool)
		if err != nil {
			t.Fatal(err)
		}
		tb = binary.AppendUvarint(tb, uint64(len(b)))
		tb = append(tb, b...)
	}
	toolsH := sha256.Sum256(tb)
	id := sha256.Sum256(append(append(h[:], sysH[:]...), toolsH[:]...))
	return hex.EncodeToString(id[:])
}

// TestIDIsTheDocumentedHash checks Put's ids, made with a recycled
// encoding buffer per Put, against the definition computed
// afresh, whole and step by step, with and without a system prompt and
// tools, across Puts of different sizes sharing the buffers.
func TestIDIsTheDocumentedHash(t *testing.T) {
	t.Parallel()
	sys := "You are terse."
	tools := []*llmv1.ToolSchema{{Name: "read", Description: "Read a file.", Parameters: `{"type":"object"}`}, {Name: "bash", Parameters: `{}`}}
	c := New(1<<24, 0)
	for _, tc := range []struct {
		name   string
		system *string
		tools  []*llmv1.ToolSchema
	}{{"bare", nil, nil}, {"system", &sys, nil}, {"tools", nil, tools}, {"both", &sys, tools}} {
		conv := msgs(tc.name, 6, 3000)
		conv = append(conv, msg(strings.Repeat("long ", 20000)), msg("short"))
		whole, err := c.Put("t", nil, Request{Messages: conv, Added: conv, System: tc.system, Tools: tc.tools})
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceID(t, "t", conv, tc.system, tc.tools); whole.ID() != want {
			t.Fatalf("%s whole: id %s, want %s", tc.name, whole.ID(), want)
		}
		var e *Entry
		for _, n := range []int{1, 4, 7, len(conv)} { // the last step adds the long message's successor
			from := 0
			if e != nil {
				from = len(e.Messages)
			}
			e, err = c.Put("t2", e, Request{Messages: conv[:n], Added: conv[from:n], System: tc.system, Tools: tc.tools, SameSystem: e != nil, SameTools: e != nil})
			if err != nil {
				t.Fatal(err)
			}
			if want := referenceID(t, "t2", conv[:n], tc.system, tc.tools); e.ID() != want {
				t.Fatalf("%s step to %d: id %s, want %s", tc.name, n, e.ID(), want)
			}
		}
	}
}

// BenchmarkPut is one model step's remember: a conversation continued by
// the assistant's tool call and its 1.5 KB result, the system prompt and
// the tools the same (as the agent sends a step). Each iteration continues
// the entry the previous one made, as a session's steps do (a new entry
// each time, the previous one removed).
func BenchmarkPut(b *testing.B) {
	c := New(1<<30, 0)
	sys := "system prompt"
	base := msgs("m", 10, 500)
	step := []*llmv1.Message{
		{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: "call_1", Name: "read", Arguments: `{"file_path":"f.txt"}`}}}}},
		{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: "call_1", Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: strings.Repeat("12: some line of text\n", 70)}}}}}}}}},
	}
	all := append(append([]*llmv1.Message(nil), base...), step...)
	prev, err := c.Put("t", nil, Request{Messages: base, Added: base, System: &sys})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start, n := cputime.Process(), 0
	for b.Loop() {
		n++
		if prev, err = c.Put("t", prev, Request{Messages: all, Added: step, System: &sys, SameSystem: true}); err != nil {
			b.Fatal(err)
		}
		all = append(all, step...)
	}
	b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(n), "cpu-ns/op")
}
