// Command mcpbridge serves the tools of MCP servers as a dsh toolhost.
//
//	mcpbridge --config mcp.json [--listen 127.0.0.1:7703]
//
// The config names the servers: {"servers": {"fs": {"command": "npx",
// "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
// "web": {"url": "http://127.0.0.1:8080/mcp"}}}. Tools are served as
// "<server>__<tool>". The bound address is printed on stdout as
// "dsh-toolhost listening on HOST:PORT".
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dsh-dev/dsh/services/mcpbridge"
)

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	listen := flag.String("listen", env("DSH_LISTEN", "127.0.0.1:7703"), "HOST:PORT to serve dsh.tools.v1.ToolHost on (env DSH_LISTEN)")
	config := flag.String("config", env("DSH_MCP_CONFIG", ""), "JSON config file of MCP servers (env DSH_MCP_CONFIG)")
	callTimeout := flag.Duration("call-timeout", 0, "budget of one MCP tool call (0 = toolhost default, 2m)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *config, *callTimeout, log); err != nil {
		log.Error("mcpbridge failed", "err", err)
		os.Exit(1)
	}
}

func run(listen, config string, callTimeout time.Duration, log *slog.Logger) error {
	if config == "" {
		return fmt.Errorf("--config is required")
	}
	servers, err := mcpbridge.LoadConfig(config)
	if err != nil {
		return err
	}
	b, err := mcpbridge.New(mcpbridge.Config{Servers: servers, CallTimeout: callTimeout}, log)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Printf("dsh-toolhost listening on %s\n", lis.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return b.Serve(ctx, lis)
}
