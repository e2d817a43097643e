// Package toolsdk is the public Go SDK for writing a dsh toolhost: a process
// that serves tools to dsh agents over the dsh.tools.v1.ToolHost gRPC
// service.
//
// A tool is a name, a description, a JSON Schema of its arguments and a body.
// Define derives the schema from a Go struct and validates the model's
// arguments against it before the body runs; RawTool takes a raw schema for
// bridges (MCP and the like) whose bodies validate themselves. Options add
// pure presenters (the pending and completed cards a UI shows), a
// concurrency classifier and a cooperative timeout.
//
// A Host serves a live set of tools (Add and Remove feed WatchTools); Serve
// runs one with gRPC health, reflection and graceful shutdown in one call:
//
//	type Args struct {
//		City string `json:"city" jsonschema:"required,description=City name"`
//	}
//	weather := toolsdk.Define("weather", "Current weather for a city.",
//		func(ctx context.Context, call *toolsdk.Call, a Args) (toolsdk.Result, error) {
//			return toolsdk.Text("sunny in " + a.City), nil
//		})
//	err := toolsdk.Serve(ctx, "127.0.0.1:7710", weather)
//
// Failures are results, never crashed hosts: invalid arguments become an
// INVALID_ARGS result listing every violation, an unknown tool UNKNOWN_TOOL,
// a panic TOOL_PANIC, a body that gives up at its deadline TOOL_TIMEOUT, and
// any error the body returns "Error: <message>" (with {name, code} when the
// error has a Code() string method, see Error). Only malformed requests
// (missing cwd, relative paths, oversized arguments) are gRPC errors.
//
// Interceptor implements the dsh.tools.v1.ToolInterceptor service from two
// functions, for policy services that allow, deny or ask before a call and
// accept or block its outcome.
package toolsdk
