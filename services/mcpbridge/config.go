package mcpbridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// ServerConfig is one MCP server: exactly one of Command or URL.
type ServerConfig struct {
	// Type is the transport: "stdio", "http" (streamable HTTP) or "sse"
	// (the legacy HTTP+SSE transport). Empty: stdio with a command, http
	// with a url. VS Code's "streamableHttp"/"streamable-http" mean http.
	Type string `json:"type,omitempty"`
	// Command starts a stdio server.
	Command string `json:"command,omitempty"`
	// Args are the command's arguments.
	Args []string `json:"args,omitempty"`
	// Env sets variables in the command's environment. The environment is
	// an allow-list: DefaultEnv taken from the bridge, then PassEnv, then
	// Env; nothing else of the bridge's environment reaches the server.
	Env map[string]string `json:"env,omitempty"`
	// PassEnv names more variables to copy from the bridge's environment.
	PassEnv []string `json:"passEnv,omitempty"`
	// Dir is the command's working directory.
	Dir string `json:"cwd,omitempty"`
	// URL is a streamable-HTTP (or, with type "sse", HTTP+SSE) endpoint.
	URL string `json:"url,omitempty"`
	// Headers are sent with every HTTP request (e.g. Authorization).
	Headers map[string]string `json:"headers,omitempty"`
}

// DefaultEnv are the variables a stdio server inherits from the bridge
// (when set), as the reference MCP clients do; everything else must be
// named in the server's env or passEnv.
var DefaultEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER", "LOGNAME", "SHELL"}

// FileConfig is the bridge's config: {"servers": {"<name>": ServerConfig}}.
// ParseConfig also reads the formats other MCP clients write (see there).
type FileConfig struct {
	Servers map[string]ServerConfig `json:"servers"`
	// Notes are things ParseConfig ignored on purpose (fields of other
	// clients, disabled servers), for the bridge to log.
	Notes []string `json:"-"`
}

var serverNameRE = regexp.MustCompile(`^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$`)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// transportType is the normalised transport of a server ("" when the type
// is unknown).
func (s ServerConfig) transportType() string {
	switch strings.ToLower(s.Type) {
	case "":
		if s.URL != "" {
			return "http"
		}
		return "stdio"
	case "stdio":
		return "stdio"
	case "http", "streamablehttp", "streamable-http", "streamable_http":
		return "http"
	case "sse":
		return "sse"
	}
	return ""
}

// Validate checks server names (letters, digits, '-', single '_'; no "__",
// which separates server and tool) and that each server has exactly one of
// command or url, matching its type.
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
		switch typ := s.transportType(); {
		case typ == "":
			errs = append(errs, fmt.Errorf("config: server %q: type %q is not one of stdio, http, sse", name, s.Type))
		case typ == "stdio" && s.Command == "" && s.URL != "":
			errs = append(errs, fmt.Errorf("config: server %q: type %s needs a command, not a url", name, s.Type))
		case typ != "stdio" && s.Command != "":
			errs = append(errs, fmt.Errorf("config: server %q: type %s needs a url, not a command", name, s.Type))
		}
		if s.URL == "" && (len(s.Headers) > 0) {
			errs = append(errs, fmt.Errorf("config: server %q: headers need a url", name))
		}
		if s.Command == "" && (len(s.Args) > 0 || len(s.Env) > 0 || len(s.PassEnv) > 0 || s.Dir != "") {
			errs = append(errs, fmt.Errorf("config: server %q: args, env, passEnv and cwd need a command", name))
		}
		for _, k := range append(sortedKeys(s.Env), s.PassEnv...) {
			if !envNameRE.MatchString(k) {
				errs = append(errs, fmt.Errorf("config: server %q: %q is not an environment variable name", name, k))
			}
		}
	}
	return errors.Join(errs...)
}

// Names returns the server names in sorted order.
func (c FileConfig) Names() []string {
	return sortedKeys(c.Servers)
}

// foreignFields are server fields other MCP clients write that mean nothing
// to the bridge: they are ignored with a note ("disabled" drops the server).
var foreignFields = map[string]bool{
	"disabled": true, "autoApprove": true, "alwaysAllow": true, "timeout": true, "transportType": true,
	"description": true, "enabled": true, "trust": true, "includeTools": true, "excludeTools": true,
}

// ParseConfig decodes and validates a config. It reads the bridge's own
// format and the ones users already have:
//
//	{"servers": {"fs": {"command": "...", "args": [...], "env": {...}}}}    dsh, VS Code (with "type")
//	{"mcpServers": {"fs": {"command": "...", "args": [...]}}}               Claude Desktop, Cursor, Windsurf, Cline
//
// Unknown server fields are errors, except fields other clients define
// (disabled, autoApprove, alwaysAllow, timeout, ...), which are ignored
// with a note; "disabled": true (or "enabled": false) leaves the server out.
// Unknown top-level keys are errors in a file without "mcpServers"; Claude
// Desktop's config carries app settings beside "mcpServers", so there they
// are ignored. VS Code's "inputs" are refused where a server uses one
// (${input:...}): the bridge has no one to prompt.
func ParseConfig(b []byte) (FileConfig, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return FileConfig{}, fmt.Errorf("config: %w", err)
	}
	c := FileConfig{Servers: map[string]ServerConfig{}}
	_, foreign := top["mcpServers"]
	for _, key := range sortedKeys(top) {
		switch key {
		case "servers", "mcpServers":
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(top[key], &raw); err != nil {
				return FileConfig{}, fmt.Errorf("config: %s: %w", key, err)
			}
			for _, name := range sortedKeys(raw) {
				s, keep, notes, err := parseServer(name, raw[name])
				if err != nil {
					return FileConfig{}, err
				}
				c.Notes = append(c.Notes, notes...)
				if !keep {
					continue
				}
				if _, dup := c.Servers[name]; dup {
					return FileConfig{}, fmt.Errorf("config: server %q is defined in both servers and mcpServers", name)
				}
				c.Servers[name] = s
			}
		case "inputs":
			c.Notes = append(c.Notes, `ignored "inputs" (VS Code prompts; the bridge cannot ask anyone)`)
		default:
			if !foreign {
				return FileConfig{}, fmt.Errorf("config: unknown top-level key %q (want servers or mcpServers)", key)
			}
			c.Notes = append(c.Notes, fmt.Sprintf("ignored top-level key %q", key))
		}
	}
	if bytes.Contains(b, []byte("${input:")) {
		return FileConfig{}, errors.New(`config: a server uses a VS Code input (${input:...}); put the value in the server's env or headers instead`)
	}
	return c, c.Validate()
}

func parseServer(name string, raw json.RawMessage) (ServerConfig, bool, []string, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return ServerConfig{}, false, nil, fmt.Errorf("config: server %q: %w", name, err)
	}
	keep := true
	var notes []string
	for _, k := range sortedKeys(fields) {
		if !foreignFields[k] {
			continue
		}
		switch {
		case k == "disabled" && string(fields[k]) == "true", k == "enabled" && string(fields[k]) == "false":
			keep = false
			notes = append(notes, fmt.Sprintf("server %q is disabled; skipped", name))
		default:
			notes = append(notes, fmt.Sprintf("server %q: ignored field %q", name, k))
		}
		delete(fields, k)
	}
	rest, _ := json.Marshal(fields)
	var s ServerConfig
	dec := json.NewDecoder(bytes.NewReader(rest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return ServerConfig{}, false, nil, fmt.Errorf("config: server %q: %w", name, err)
	}
	return s, keep, notes, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (FileConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return FileConfig{}, fmt.Errorf("config: %w", err)
	}
	return ParseConfig(b)
}

// environ is the environment of a stdio server: DefaultEnv and PassEnv
// from the bridge's (getenv), then the server's Env.
func (s ServerConfig) environ(getenv func(string) (string, bool)) []string {
	vals := map[string]string{}
	for _, k := range append(append([]string(nil), DefaultEnv...), s.PassEnv...) {
		if v, ok := getenv(k); ok {
			vals[k] = v
		}
	}
	for k, v := range s.Env {
		vals[k] = v
	}
	out := make([]string, 0, len(vals))
	for _, k := range sortedKeys(vals) {
		out = append(out, k+"="+vals[k])
	}
	return out
}
