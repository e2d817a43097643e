// Package mcpbridge is a dsh toolhost that serves the tools of MCP servers.
//
// It connects to the MCP servers named in a JSON config file — stdio commands
// and streamable-HTTP URLs — lists their tools and serves each one through
// dsh.tools.v1.ToolHost as a raw JSON-Schema tool named "<server>__<tool>"
// (the MCP server validates its own input). MCP results map to dsh result
// blocks (text, images, embedded resources, isError); MCP progress
// notifications become live ToolOutput on the "progress" stream; a tool with
// the readOnlyHint annotation is served as always concurrency-safe.
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
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"time"

	"google.golang.org/grpc"
)

// ServerConfig is one MCP server: exactly one of Command or URL.
type ServerConfig struct {
	// Command starts a stdio server.
	Command string `json:"command,omitempty"`
	// Args are the command's arguments.
	Args []string `json:"args,omitempty"`
	// Env adds variables to the command's environment (the bridge's
	// environment is inherited).
	Env map[string]string `json:"env,omitempty"`
	// Dir is the command's working directory.
	Dir string `json:"cwd,omitempty"`
	// URL is a streamable-HTTP endpoint.
	URL string `json:"url,omitempty"`
	// Headers are sent with every HTTP request (e.g. Authorization).
	Headers map[string]string `json:"headers,omitempty"`
}

// FileConfig is the JSON config file: {"servers": {"<name>": ServerConfig}}.
type FileConfig struct {
	Servers map[string]ServerConfig `json:"servers"`
}

var serverNameRE = regexp.MustCompile(`^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$`)

// Validate checks server names (letters, digits, '-', single '_'; no "__",
// which separates server and tool) and that each server has exactly one of
// command or url.
func (c FileConfig) Validate() error {
	if len(c.Servers) == 0 {
		return errors.New("config: no servers")
	}
	var errs []error
	for _, name := range c.Names() {
		s := c.Servers[name]
		if !serverNameRE.MatchString(name) || len(name) > 32 {
			errs = append(errs, fmt.Errorf("config: server name %q must be 1-32 letters, digits, '-' or single '_'", name))
		}
		if (s.Command == "") == (s.URL == "") {
			errs = append(errs, fmt.Errorf("config: server %q needs exactly one of command or url", name))
		}
		if s.URL == "" && (len(s.Headers) > 0) {
			errs = append(errs, fmt.Errorf("config: server %q: headers need a url", name))
		}
		if s.Command == "" && (len(s.Args) > 0 || len(s.Env) > 0 || s.Dir != "") {
			errs = append(errs, fmt.Errorf("config: server %q: args, env and cwd need a command", name))
		}
	}
	return errors.Join(errs...)
}

// Names returns the server names in sorted order.
func (c FileConfig) Names() []string {
	out := make([]string, 0, len(c.Servers))
	for n := range c.Servers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ParseConfig decodes and validates a config; unknown fields are errors.
func ParseConfig(b []byte) (FileConfig, error) {
	var c FileConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return FileConfig{}, fmt.Errorf("config: %w", err)
	}
	return c, c.Validate()
}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (FileConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return FileConfig{}, fmt.Errorf("config: %w", err)
	}
	return ParseConfig(b)
}

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
	// ServerOptions are added to the gRPC server Serve builds: TLS
	// credentials and the peer check (internal/auth.ServerFlags).
	ServerOptions []grpc.ServerOption
}
