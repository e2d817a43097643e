package mcpbridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ReadResourceTool is the bridge's own tool: resources/read on the server
// that owns a URI, so the model can follow a resource_link block.
const ReadResourceTool = "mcp_read_resource"

// maxLinks bounds the URI → server index; when full it starts over (a
// forgotten link still resolves with an explicit server).
const maxLinks = 4096

// linkIndex remembers which server returned which resource URI.
type linkIndex struct {
	mu sync.Mutex
	m  map[string]string
}

func (l *linkIndex) note(server string, content []mcp.Content) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range content {
		var uri string
		switch v := c.(type) {
		case *mcp.ResourceLink:
			uri = v.URI
		case *mcp.EmbeddedResource:
			if v.Resource != nil {
				uri = v.Resource.URI
			}
		}
		if uri == "" {
			continue
		}
		if len(l.m) >= maxLinks {
			clear(l.m)
		}
		l.m[uri] = server
	}
}

func (l *linkIndex) lookup(uri string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.m[uri]
	return s, ok
}

func (b *Bridge) serverNames() []string {
	out := make([]string, 0, len(b.servers))
	for _, s := range b.servers {
		out = append(out, s.name)
	}
	return out
}

func (b *Bridge) readResourceTool() toolsdk.Tool {
	schema, _ := json.Marshal(map[string]any{
		"type": "object",
		"properties": map[string]any{
			"uri":    map[string]any{"type": "string", "description": "The resource URI, e.g. from a resource link in a tool result."},
			"server": map[string]any{"type": "string", "enum": b.serverNames(), "description": "The MCP server that owns the resource; optional when the URI came from a tool result."},
		},
		"required":             []string{"uri"},
		"additionalProperties": false,
	})
	desc := "Read a resource of an MCP server by URI: follow a resource link from an MCP tool's result, or read a resource a server offers. Returns the resource's content."
	return toolsdk.RawTool(ReadResourceTool, desc, schema, b.readResource, toolsdk.AlwaysConcurrencySafe())
}

func (b *Bridge) readResource(ctx context.Context, _ *toolsdk.Call, args json.RawMessage) (toolsdk.Result, error) {
	var in struct {
		URI    *string `json:"uri"`
		Server *string `json:"server"`
	}
	if err := json.Unmarshal(args, &in); err != nil {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{`"arguments" must be an object with a string "uri"`}}
	}
	if in.URI == nil || *in.URI == "" {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{`"uri" is required`}}
	}
	names := b.serverNames()
	name := ""
	switch {
	case in.Server != nil:
		name = *in.Server
	case len(names) == 1:
		name = names[0]
	default:
		var ok bool
		if name, ok = b.links.lookup(*in.URI); !ok {
			return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{fmt.Sprintf(`"server" is required for a uri no tool returned; one of [%s]`, strings.Join(names, ", "))}}
		}
	}
	var s *server
	for _, c := range b.servers {
		if c.name == name {
			s = c
		}
	}
	if s == nil {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{fmt.Sprintf(`"server" must be one of [%s]`, strings.Join(names, ", "))}}
	}
	session, rctx, done := s.begin(ctx)
	defer done()
	if session == nil {
		return toolsdk.Result{}, errUnavailable(s.name)
	}
	res, err := session.ReadResource(rctx, &mcp.ReadResourceParams{URI: *in.URI})
	if err != nil {
		if ctx.Err() != nil {
			return toolsdk.Result{}, ctx.Err()
		}
		err = s.requestError(ctx, rctx, err)
		if ae := (*toolsdk.ArgsError)(nil); errors.As(err, &ae) {
			ae.Violations = []string{fmt.Sprintf(`"uri" %q on server %s: %s`, *in.URI, s.name, strings.Join(ae.Violations, "; "))}
		}
		return toolsdk.Result{}, err
	}
	out := make([]*llmv1.ContentBlock, 0, len(res.Contents))
	for _, c := range res.Contents {
		if c != nil {
			out = append(out, documentBlock(c))
		}
	}
	if len(out) == 0 {
		out = append(out, toolsdk.TextBlock("(the resource is empty)"))
	}
	return toolsdk.Result{Content: out}, nil
}

// callError maps a failed MCP request: JSON-RPC invalid params (-32602) is
// the model's fault (INVALID_ARGS, with the server's message); anything
// else is MCP_ERROR.
func callError(server string, err error) error {
	var werr *jsonrpc.Error
	if errors.As(err, &werr) && werr.Code == jsonrpc.CodeInvalidParams {
		return &toolsdk.ArgsError{Violations: []string{werr.Message}}
	}
	return errProtocol(server, err)
}

// maxInstructions caps one server's instructions in the workspace context.
const maxInstructions = 16 << 10

// workspaceContext answers GetWorkspaceContext with the connected servers'
// initialize instructions as instruction files named "mcp://<server>"; the
// bridge owns no workspace. The agent puts them in the system prompt's
// workspace section beside AGENTS.md (services/agent/internal/prompt).
func (b *Bridge) workspaceContext(context.Context, string) (*toolsv1.GetWorkspaceContextResponse, error) {
	out := &toolsv1.GetWorkspaceContextResponse{}
	h := sha256.New()
	for _, s := range b.servers {
		text := s.instructions()
		if text == "" {
			continue
		}
		f := &toolsv1.InstructionFile{Path: "mcp://" + s.name, Content: text, SizeBytes: int64(len(text))}
		if len(text) > maxInstructions {
			f.Content = strings.ToValidUTF8(text[:maxInstructions], "")
			f.Truncated = true
		}
		out.Instructions = append(out.Instructions, f)
		fmt.Fprintf(h, "%s\x00%s\x00", s.name, text)
	}
	if len(out.Instructions) > 0 {
		out.Version = "mcp-" + hex.EncodeToString(h.Sum(nil))[:16]
	}
	return out, nil
}

// logMessage writes a server's notifications/message to the bridge's log
// at the matching level.
func (s *server) logMessage(ctx context.Context, p *mcp.LoggingMessageParams) {
	if p == nil {
		return
	}
	level := slog.LevelInfo
	switch p.Level {
	case "debug":
		level = slog.LevelDebug
	case "warning":
		level = slog.LevelWarn
	case "error", "critical", "alert", "emergency":
		level = slog.LevelError
	}
	data, ok := p.Data.(string)
	if !ok {
		j, _ := json.Marshal(p.Data)
		data = string(j)
	}
	s.log.Log(ctx, level, "mcp server log", "mcp_level", string(p.Level), "mcp_logger", p.Logger, "data", data)
}
