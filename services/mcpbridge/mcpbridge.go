// Package mcpbridge is a dsh toolhost that serves the tools of MCP servers.
//
// It connects to the MCP servers named in a JSON config file — stdio commands
// and streamable-HTTP URLs — lists their tools and serves each one through
// dsh.tools.v1.ToolHost as a raw JSON-Schema tool named "<server>__<tool>"
// (the MCP server validates its own input), plus its own tool
// mcp_read_resource (resources/read on the server that owns a URI, so the
// model can follow a resource link). MCP results map to dsh result blocks
// (text, image, audio, document, resource_link, annotations kept; content
// for the user only goes to the result's view, not the model; isError);
// JSON-RPC invalid params is INVALID_ARGS; MCP progress notifications
// become live ToolOutput on the "progress" stream; server logs go to the
// bridge's log; server instructions are answered by GetWorkspaceContext as
// instruction files "mcp://<server>"; a tool with the readOnlyHint
// annotation is served as always concurrency-safe.
//
// # Configuration and environment
//
// ParseConfig reads the bridge's format and those of Claude Desktop,
// Cursor and VS Code. A stdio server's environment is an allow-list
// (DefaultEnv, then the server's passEnv and env), never the bridge's.
//
// # Health
//
// Each server reports on the gRPC health service HealthService(name):
// NOT_SERVING until it answered initialize (bounded by Config.InitTimeout,
// then logged and retried) and its tools are listed, and again while it is
// lost. HTTP servers are pinged (Config.KeepAlive); a lost connection
// fails the requests in flight with its cause.
//
// # Delivery
//
// A server's tools/list_changed notification triggers a re-list; the changes
// reach WatchTools as new full snapshots. Cancelling an Execute RPC cancels
// the MCP request (notifications/cancelled).
//
// # Restarts
//
// Each server has a supervisor goroutine. When a connection ends (a stdio
// server crashed, an HTTP session died) the supervisor reconnects with
// exponential backoff (Config.MinBackoff doubling to Config.MaxBackoff, reset
// after a connection stayed up for a minute). While a server is down its
// tools stay listed and calls fail with MCP_UNAVAILABLE, so a restart does not
// churn the agent's registry; the tool set is re-synced on reconnect.
//
// # Shutdown
//
// Serve returns when its context ends: the gRPC server drains (health
// NOT_SERVING first), then every MCP session is closed and stdio servers are
// terminated.
package mcpbridge

import (
	"time"

	"google.golang.org/grpc"
)

// Config configures a Bridge.
type Config struct {
	// Servers are the MCP servers to bridge.
	Servers FileConfig
	// MinBackoff is the first reconnect delay; zero means 200ms.
	MinBackoff time.Duration
	// MaxBackoff caps the reconnect delay; zero means 30s.
	MaxBackoff time.Duration
	// CallTimeout bounds one MCP call when the tool declares none; zero
	// means the toolhost default.
	CallTimeout time.Duration
	// InitTimeout bounds a connection attempt (the initialize handshake
	// and, for stdio, starting the process); a server that does not answer
	// in time is logged, marked NOT_SERVING and retried with backoff. Zero
	// means 30s (npx may download the server on its first start).
	InitTimeout time.Duration
	// KeepAlive is the interval of MCP pings to HTTP servers; one that
	// misses a ping (no answer within half the interval) is treated as gone
	// (reconnect). Zero means 15s; negative disables pings.
	KeepAlive time.Duration
	// Getenv reads the bridge's environment for the stdio servers'
	// allow-list; nil means os.LookupEnv.
	Getenv func(string) (string, bool)
	// ServerOptions are added to the gRPC server Serve builds: TLS
	// credentials and the peer check (internal/auth.ServerFlags).
	ServerOptions []grpc.ServerOption
}
