package mcpbridge_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/toolstream"
	"github.com/dsh-dev/dsh/services/mcpbridge"
)

// referenceServers is where scripts/setup-polyglot.sh installs the
// reference MCP servers (versions pinned in its package.json and lock).
const referenceServers = "../../tests/mcpservers/node_modules/@modelcontextprotocol"

// The reference MCP servers from npm (everything, filesystem, memory)
// behind the bridge over stdio: every kind of content they return arrives
// intact (text, images, annotations, resource links the model can follow,
// embedded resources, structured content), progress arrives live, and a
// secret in the bridge's environment does not reach them.
func TestReferenceServers(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the reference MCP servers need it")
	}
	if _, err := os.Stat(filepath.Join(referenceServers, "server-everything", "dist", "index.js")); err != nil {
		t.Fatalf("the reference MCP servers are not installed (%v): run scripts/setup-polyglot.sh", err)
	}
	dir := t.TempDir()
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	if err := os.WriteFile(filepath.Join(dir, "pic.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	script := func(name string) string { return filepath.Join(referenceServers, name, "dist", "index.js") }
	env := map[string]string{"PATH": os.Getenv("PATH"), "HOME": dir, "DSH_PROVIDER_KEY": "canary-5be1d0"}
	c, _ := startBridgeWith(t, mcpbridge.Config{
		Servers: mcpbridge.FileConfig{Servers: map[string]mcpbridge.ServerConfig{
			"every": {Command: node, Args: []string{script("server-everything"), "stdio"}},
			"fs":    {Command: node, Args: []string{script("server-filesystem"), dir}},
			"mem":   {Command: node, Args: []string{script("server-memory")}, Env: map[string]string{"MEMORY_FILE_PATH": filepath.Join(dir, "memory.jsonl")}},
		}},
		Getenv:      func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		InitTimeout: time.Minute,
	}, logWriter{t})
	tools := names(t, c)
	t.Logf("%d tools: %v", len(tools), tools)

	type check func(t *testing.T, outs []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult)
	hasText := func(sub string) check {
		return func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if r.GetIsError() || !strings.Contains(blocksText(r.GetContent()), sub) {
				t.Errorf("want text with %q, got %v", sub, r)
			}
		}
	}
	var link *llmv1.ResourceLinkBlock
	cases := []struct {
		tool, args string
		check      check
	}{
		{"every__echo", `{"message":"round trip"}`, hasText("round trip")},
		{"every__get-sum", `{"a":2,"b":40}`, hasText("42")},
		{"every__echo", `{}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if !r.GetIsError() {
				t.Errorf("echo without a message: %v, want an error", r)
			}
		}},
		{"every__get-tiny-image", `{}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if count(r, func(b *llmv1.ContentBlock) bool {
				return b.GetImage().GetMimeType() == "image/png" && len(b.GetImage().GetData()) > 0
			}) != 1 {
				t.Errorf("want one inline PNG, got %v", r)
			}
		}},
		{"every__get-annotated-message", `{"messageType":"error","includeImage":true}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			// The error text is for both audiences, the image for the user
			// only: the model gets the text, the card shows both.
			annotated := count(r, func(b *llmv1.ContentBlock) bool {
				return b.GetAnnotations().GetPriority() == 1 && len(b.GetAnnotations().GetAudience()) == 2
			})
			images := count(r, func(b *llmv1.ContentBlock) bool { return b.GetImage() != nil })
			var viewImages int
			for _, b := range r.GetView().GetGeneric().GetContent() {
				if b.GetImage() != nil && mcpbridge.UserOnly(b) {
					viewImages++
				}
			}
			if annotated != 1 || images != 0 || viewImages != 1 {
				t.Errorf("annotated text blocks %d (want 1), images to the model %d (want 0), user-only images in the view %d (want 1)", annotated, images, viewImages)
			}
		}},
		{"every__get-resource-links", `{"count":2}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			for _, b := range r.GetContent() {
				if l := b.GetResourceLink(); l != nil && link == nil {
					link = l
				}
			}
			if n := count(r, func(b *llmv1.ContentBlock) bool {
				return b.GetResourceLink().GetUri() != "" && b.GetResourceLink().GetMimeType() != ""
			}); n != 2 {
				t.Errorf("want 2 resource links with mime types, got %d: %v", n, r)
			}
		}},
		{"every__get-resource-reference", `{"resourceType":"Text","resourceId":1}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if count(r, func(b *llmv1.ContentBlock) bool {
				return b.GetDocument().GetUri() != "" && b.GetDocument().GetText() != ""
			}) != 1 {
				t.Errorf("want an embedded text resource as a document, got %v", r)
			}
		}},
		{"every__get-structured-content", `{"location":"Chicago"}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if r.GetIsError() || !strings.Contains(r.GetMeta(), "structuredContent") || !strings.Contains(r.GetMeta(), "temperature") {
				t.Errorf("want structured content in meta, got %v", r)
			}
		}},
		{"every__trigger-long-running-operation", `{"duration":1,"steps":3}`, func(t *testing.T, outs []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if r.GetIsError() || len(outs) < 3 {
				t.Errorf("want 3 progress outputs before the result, got %d outputs, %v", len(outs), r)
			}
		}},
		{"every__get-env", `{}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			text := blocksText(r.GetContent())
			if strings.Contains(text, "canary-5be1d0") || strings.Contains(text, "DSH_PROVIDER_KEY") || !strings.Contains(text, "PATH") {
				t.Errorf("the server's environment: %s", text)
			}
		}},
		{"fs__write_file", `{"path":` + jsonString(filepath.Join(dir, "a.txt")) + `,"content":"hello fs"}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if r.GetIsError() {
				t.Errorf("write_file: %v", r)
			}
		}},
		{"fs__read_text_file", `{"path":` + jsonString(filepath.Join(dir, "a.txt")) + `}`, hasText("hello fs")},
		{"fs__read_media_file", `{"path":` + jsonString(filepath.Join(dir, "pic.png")) + `}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if count(r, func(b *llmv1.ContentBlock) bool { return string(b.GetImage().GetData()) == string(png) }) != 1 {
				t.Errorf("want the PNG back as an image, got %v", r)
			}
		}},
		{"fs__read_text_file", `{"path":"/etc/passwd"}`, func(t *testing.T, _ []*toolsv1.ToolOutput, r *toolsv1.ToolExecutionResult) {
			if !r.GetIsError() {
				t.Errorf("read outside the allowed directory: %v", r)
			}
		}},
		{"mem__create_entities", `{"entities":[{"name":"dsh","entityType":"project","observations":["bridges MCP"]}]}`, hasText("dsh")},
		{"mem__read_graph", `{}`, hasText("bridges MCP")},
	}
	for _, k := range cases {
		outs, r := execute(t, c, k.tool, k.args)
		t.Run(k.tool, func(t *testing.T) { k.check(t, outs, r) })
	}
	if link == nil {
		t.Fatal("no resource link to follow")
	}
	// The model follows a link through the bridge.
	_, r := execute(t, c, mcpbridge.ReadResourceTool, `{"uri":`+jsonString(link.GetUri())+`}`)
	if r.GetIsError() || count(r, func(b *llmv1.ContentBlock) bool { return b.GetDocument().GetUri() == link.GetUri() }) == 0 {
		t.Errorf("reading %s: %v", link.GetUri(), r)
	}
	ws, err := c.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ws.GetInstructions() {
		t.Logf("instructions %s: %d bytes", f.GetPath(), len(f.GetContent()))
	}
}

func execute(t *testing.T, c toolsv1.ToolHostClient, name, args string) ([]*toolsv1.ToolOutput, *toolsv1.ToolExecutionResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := c.Execute(ctx, &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{CallId: "c", Name: name, Arguments: args, Context: toolCtx}})
	if err != nil {
		t.Fatal(err)
	}
	r, outs, err := toolstream.Collect(stream)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return outs, r
}

func count(r *toolsv1.ToolExecutionResult, f func(*llmv1.ContentBlock) bool) int {
	n := 0
	for _, b := range r.GetContent() {
		if f(b) {
			n++
		}
	}
	return n
}

func blocksText(bs []*llmv1.ContentBlock) string {
	var parts []string
	for _, b := range bs {
		parts = append(parts, b.GetText().GetText())
	}
	return strings.Join(parts, "\n")
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
