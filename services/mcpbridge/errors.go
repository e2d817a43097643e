package mcpbridge

import "github.com/dsh-dev/dsh/sdk/go/toolsdk"

// Stable codes of bridge failures, carried on error results as {name, code}.
// They are results, not gRPC errors: an MCP server that is down or broken
// fails the call, never the bridge.
const (
	// CodeUnavailable: the tool's MCP server is not connected (starting or
	// restarting after a crash).
	CodeUnavailable = "MCP_UNAVAILABLE"
	// CodeProtocol: the MCP server answered the call with a protocol-level
	// error (JSON-RPC error, closed connection, invalid response).
	CodeProtocol = "MCP_ERROR"
)

func errUnavailable(server string) error {
	return toolsdk.NewError("McpError", CodeUnavailable, "MCP server \""+server+"\" is not connected; it is being restarted", nil)
}

func errProtocol(server string, err error) error {
	return toolsdk.NewError("McpError", CodeProtocol, "MCP server \""+server+"\": "+err.Error(), err)
}
