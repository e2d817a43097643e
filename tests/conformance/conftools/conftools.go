// Package conftools implements the conformance tools (see package
// conformance for their specification) with the Go tool SDK, so the
// conformance suite can run against a Go host built with toolsdk.
package conftools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// EchoOpts are conf_echo's nested options.
type EchoOpts struct {
	Flag bool `json:"flag" jsonschema:"required,description=A required flag."`
}

// EchoArgs are conf_echo's arguments.
type EchoArgs struct {
	Text string    `json:"text" jsonschema:"required,description=Text to echo back."`
	Mode string    `json:"mode,omitempty" jsonschema:"enum=plain|upper,description=How to echo."`
	Tags []string  `json:"tags,omitempty" jsonschema:"description=Free-form tags."`
	Opts *EchoOpts `json:"opts,omitempty" jsonschema:"description=Nested options."`
}

type failArgs struct {
	Message string `json:"message" jsonschema:"required,description=The error message."`
}

type slowArgs struct {
	Key string `json:"key" jsonschema:"required,description=Where conf_status finds the outcome."`
	Ms  *int   `json:"ms,omitempty" jsonschema:"default=60000,description=How long to sleep."`
}

type keyArgs struct {
	Key string `json:"key" jsonschema:"required,description=The key given to conf_slow."`
}

type streamArgs struct {
	Count int `json:"count" jsonschema:"required,description=How many chunks."`
}

type barrierArgs struct {
	Key string `json:"key" jsonschema:"required,description=Barrier name."`
	N   int    `json:"n" jsonschema:"required,description=Number of calls to wait for."`
}

type addArgs struct {
	Name string `json:"name" jsonschema:"required,description=The new tool's name."`
}

type noArgs struct{}

// Tools builds the conformance tools; conf_add_tool adds tools to host.
func Tools(host *toolsdk.Host) []toolsdk.Tool {
	var mu sync.Mutex
	status := map[string]string{}
	barriers := map[string]*barrier{}
	set := func(k, v string) {
		mu.Lock()
		status[k] = v
		mu.Unlock()
	}

	echo := toolsdk.Define("conf_echo", "Echo text back.",
		func(_ context.Context, _ *toolsdk.Call, a EchoArgs) (toolsdk.Result, error) {
			out := a.Text
			if a.Mode == "upper" {
				out = strings.ToUpper(out)
			}
			return toolsdk.Result{Content: toolsdk.Text(out).Content, Meta: map[string]int{"length": utf8.RuneCountInString(a.Text)}}, nil
		},
		toolsdk.AlwaysConcurrencySafe(),
		toolsdk.PresentCall(func(a EchoArgs) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{
				Title: "echo " + a.Text, Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_OTHER, RawInput: a.Text}}}
		}),
		toolsdk.PresentResult(func(a EchoArgs, _ *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: "echoed " + a.Text}}}
		}),
	)

	fail := toolsdk.Define("conf_fail", "Fail with the given message.",
		func(_ context.Context, _ *toolsdk.Call, a failArgs) (toolsdk.Result, error) {
			return toolsdk.Result{}, errors.New(a.Message)
		})

	slow := toolsdk.Define("conf_slow", "Sleep until cancelled or ms elapse, recording the outcome under key.",
		func(ctx context.Context, call *toolsdk.Call, a slowArgs) (toolsdk.Result, error) {
			ms := 60000
			if a.Ms != nil {
				ms = *a.Ms
			}
			set(a.Key, "running")
			call.Output("stdout", "started "+a.Key)
			t := time.NewTimer(time.Duration(ms) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				set(a.Key, "completed")
				return toolsdk.Text("slept " + a.Key), nil
			case <-ctx.Done():
				set(a.Key, "cancelled")
				return toolsdk.Result{}, ctx.Err()
			}
		})

	stat := toolsdk.Define("conf_status", "Report what happened to the conf_slow call recorded under key.",
		func(_ context.Context, _ *toolsdk.Call, a keyArgs) (toolsdk.Result, error) {
			mu.Lock()
			defer mu.Unlock()
			if s, ok := status[a.Key]; ok {
				return toolsdk.Text(s), nil
			}
			return toolsdk.Text("unknown"), nil
		}, toolsdk.AlwaysConcurrencySafe())

	chunks := func(n int) string {
		var b strings.Builder
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "chunk %d\n", i)
		}
		return b.String()
	}
	stream := toolsdk.Define("conf_stream", "Stream count chunks of output, then finish.",
		func(_ context.Context, call *toolsdk.Call, a streamArgs) (toolsdk.Result, error) {
			for i := 1; i <= a.Count; i++ {
				call.Output("stdout", fmt.Sprintf("chunk %d\n", i))
			}
			return toolsdk.Text(fmt.Sprintf("streamed %d", a.Count)), nil
		},
		toolsdk.PresentCall(func(a streamArgs) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Terminal{Terminal: &toolsv1.TerminalCallView{
				Title: fmt.Sprintf("stream %d", a.Count), Description: "streams chunks"}}}
		}),
		toolsdk.PresentResult(func(a streamArgs, _ *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			zero := int32(0)
			return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Terminal{Terminal: &toolsv1.TerminalResultView{
				Output: chunks(a.Count), ExitCode: &zero}}}
		}),
	)

	bar := toolsdk.Define("conf_barrier", "Wait until n calls with the same key are running, then return.",
		func(ctx context.Context, _ *toolsdk.Call, a barrierArgs) (toolsdk.Result, error) {
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
				return toolsdk.Text("released " + a.Key), nil
			case <-time.After(10 * time.Second):
				return toolsdk.Result{}, toolsdk.Errorf("BARRIER_TIMEOUT", "barrier %s timed out waiting for %d calls", a.Key, a.N)
			case <-ctx.Done():
				return toolsdk.Result{}, ctx.Err()
			}
		}, toolsdk.AlwaysConcurrencySafe())

	add := toolsdk.Define("conf_add_tool", `Add a tool named name at runtime; it returns "dynamic <name>".`,
		func(_ context.Context, _ *toolsdk.Call, a addArgs) (toolsdk.Result, error) {
			name := a.Name
			t := toolsdk.Define(name, "A tool added at runtime.",
				func(context.Context, *toolsdk.Call, noArgs) (toolsdk.Result, error) {
					return toolsdk.Text("dynamic " + name), nil
				})
			if err := host.Add(t); err != nil {
				return toolsdk.Result{}, toolsdk.Errorf("DUPLICATE_TOOL", "%v", err)
			}
			return toolsdk.Text("added " + name), nil
		})

	return []toolsdk.Tool{echo, fail, slow, stat, stream, bar, add}
}

type barrier struct {
	count int
	done  chan struct{}
}
