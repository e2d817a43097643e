// Package mcpconf is an MCP server (modelcontextprotocol/go-sdk) that
// implements the conformance tools (see package conformance), so the
// conformance suite can run against the MCP bridge. Live output is sent as
// progress notifications whose message is the chunk text.
package mcpconf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type echoArgs struct {
	Text string   `json:"text"`
	Mode string   `json:"mode,omitempty"`
	Tags []string `json:"tags,omitempty"`
	Opts *struct {
		Flag bool `json:"flag"`
	} `json:"opts,omitempty"`
}

const echoSchema = `{"type":"object","properties":{
 "text":{"type":"string","description":"Text to echo back."},
 "mode":{"type":"string","enum":["plain","upper"],"description":"How to echo."},
 "tags":{"type":"array","items":{"type":"string"},"description":"Free-form tags."},
 "opts":{"type":"object","properties":{"flag":{"type":"boolean","description":"A required flag."}},"required":["flag"],"description":"Nested options."}},
 "required":["text"]}`

func schema(props string, required ...string) json.RawMessage {
	req, _ := json.Marshal(required)
	return json.RawMessage(`{"type":"object","properties":{` + props + `},"required":` + string(req) + `}`)
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func progress(ctx context.Context, req *mcp.CallToolRequest, n int, msg string) {
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return
	}
	_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n), Message: msg})
}

// NewServer returns an MCP server serving the conformance tools.
func NewServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "conf", Version: "v1"}, nil)
	var mu sync.Mutex
	status := map[string]string{}
	barriers := map[string]*barrier{}
	set := func(k, v string) {
		mu.Lock()
		status[k] = v
		mu.Unlock()
	}
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}

	mcp.AddTool(s, &mcp.Tool{Name: "conf_echo", Description: "Echo text back.", InputSchema: json.RawMessage(echoSchema), Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
			out := a.Text
			if a.Mode == "upper" {
				out = strings.ToUpper(out)
			}
			r := textResult(out)
			r.StructuredContent = map[string]int{"length": utf8.RuneCountInString(a.Text)}
			return r, nil, nil
		})

	mcp.AddTool(s, &mcp.Tool{Name: "conf_fail", Description: "Fail with the given message.",
		InputSchema: schema(`"message":{"type":"string"}`, "message")},
		func(_ context.Context, _ *mcp.CallToolRequest, a struct {
			Message string `json:"message"`
		}) (*mcp.CallToolResult, any, error) {
			return nil, nil, errors.New(a.Message)
		})

	mcp.AddTool(s, &mcp.Tool{Name: "conf_slow", Description: "Sleep until cancelled or ms elapse, recording the outcome under key.",
		InputSchema: schema(`"key":{"type":"string"},"ms":{"type":"integer"}`, "key")},
		func(ctx context.Context, req *mcp.CallToolRequest, a struct {
			Key string `json:"key"`
			Ms  *int   `json:"ms,omitempty"`
		}) (*mcp.CallToolResult, any, error) {
			ms := 60000
			if a.Ms != nil {
				ms = *a.Ms
			}
			set(a.Key, "running")
			progress(ctx, req, 0, "started "+a.Key)
			t := time.NewTimer(time.Duration(ms) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				set(a.Key, "completed")
				return textResult("slept " + a.Key), nil, nil
			case <-ctx.Done():
				set(a.Key, "cancelled")
				return nil, nil, ctx.Err()
			}
		})

	mcp.AddTool(s, &mcp.Tool{Name: "conf_status", Description: "Report what happened to the conf_slow call recorded under key.",
		InputSchema: schema(`"key":{"type":"string"}`, "key"), Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, a struct {
			Key string `json:"key"`
		}) (*mcp.CallToolResult, any, error) {
			mu.Lock()
			defer mu.Unlock()
			if st, ok := status[a.Key]; ok {
				return textResult(st), nil, nil
			}
			return textResult("unknown"), nil, nil
		})

	mcp.AddTool(s, &mcp.Tool{Name: "conf_stream", Description: "Stream count chunks of output, then finish.",
		InputSchema: schema(`"count":{"type":"integer"}`, "count")},
		func(ctx context.Context, req *mcp.CallToolRequest, a struct {
			Count int `json:"count"`
		}) (*mcp.CallToolResult, any, error) {
			for i := 1; i <= a.Count; i++ {
				progress(ctx, req, i, fmt.Sprintf("chunk %d\n", i))
			}
			return textResult(fmt.Sprintf("streamed %d", a.Count)), nil, nil
		})

	mcp.AddTool(s, &mcp.Tool{Name: "conf_barrier", Description: "Wait until n calls with the same key are running, then return.",
		InputSchema: schema(`"key":{"type":"string"},"n":{"type":"integer"}`, "key", "n"), Annotations: readOnly},
		func(ctx context.Context, _ *mcp.CallToolRequest, a struct {
			Key string `json:"key"`
			N   int    `json:"n"`
		}) (*mcp.CallToolResult, any, error) {
			mu.Lock()
			b := barriers[a.Key]
			if b == nil {
				b = &barrier{done: make(chan struct{})}
				barriers[a.Key] = b
			}
			b.count++
			if b.count == a.N {
				close(b.done)
			}
			mu.Unlock()
			select {
			case <-b.done:
				return textResult("released " + a.Key), nil, nil
			case <-time.After(10 * time.Second):
				return nil, nil, fmt.Errorf("barrier %s timed out waiting for %d calls", a.Key, a.N)
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		})

	mcp.AddTool(s, &mcp.Tool{Name: "conf_add_tool", Description: `Add a tool named name at runtime; it returns "dynamic <name>".`,
		InputSchema: schema(`"name":{"type":"string"}`, "name")},
		func(_ context.Context, _ *mcp.CallToolRequest, a struct {
			Name string `json:"name"`
		}) (*mcp.CallToolResult, any, error) {
			name := a.Name
			s.AddTool(&mcp.Tool{Name: name, Description: "A tool added at runtime.", InputSchema: json.RawMessage(`{"type":"object"}`)},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return textResult("dynamic " + name), nil
				})
			return textResult("added " + name), nil, nil
		})

	return s
}

type barrier struct {
	count int
	done  chan struct{}
}
