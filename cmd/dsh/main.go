// Command dsh is the dsh command line: `dsh dev` runs the whole stack in one
// process with a chat in the terminal; the other subcommands are clients of
// a running agent service, gateway, toolhost or NATS server.
//
//	dsh dev [-p PROMPT] [--json] [--data DIR]   all-in-one (what `make run` starts)
//	dsh chat [--session ID] [--addr ADDR]        chat with an agent service
//	dsh send [--session ID] PROMPT               one prompt; exit 0 iff the turn completed
//	dsh sessions list|show|events|messages|fork  inspect sessions
//	dsh events tail [--tenant T] [--session ID]  follow events on NATS
//	dsh tools list                               a toolhost's tools
//	dsh models list                              the gateway's providers and models
//
// Every subcommand takes --help; the listing ones take --json.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/dsh-dev/dsh/internal/buildinfo"
	"github.com/dsh-dev/dsh/internal/hugeheap"
)

// exitError carries a process exit code; its message, when non-empty, is
// printed as one line.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// env bundles the process's environment so commands are testable.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	args           []string
}

type command struct {
	name, summary string
	run           func(ctx context.Context, e *env, args []string) error
}

func commands() []command {
	return []command{
		{"dev", "run the whole stack in one process and chat (make run)", runDev},
		{"chat", "chat with a running agent service", runChat},
		{"send", "send one prompt, print the answer; exit 0 iff the turn completed", runSend},
		{"sessions", "list, show, fork sessions; print their events or messages", runSessions},
		{"events", "follow session events on NATS (events tail)", runEvents},
		{"tools", "list a toolhost's tools (tools list)", runTools},
		{"models", "list the gateway's providers and models (models list)", runModels},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "dsh — an agent harness served as gRPC microservices.")
	fmt.Fprintln(w, "\nUsage: dsh <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `dsh <command> --help` for a command's flags, `dsh --version` for the build.")
}

func main() {
	secrets, err := scrubbedReexec(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "dsh:", err)
		os.Exit(1)
	}
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: withSecrets(secrets, os.Getenv), args: os.Args[1:]}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	err = run(ctx, e)
	stop()
	os.Exit(exitCode(e, err))
}

func exitCode(e *env, err error) int {
	if err == nil {
		return 0
	}
	var xe *exitError
	if errors.As(err, &xe) {
		if xe.msg != "" {
			fmt.Fprintln(e.stderr, "dsh:", xe.msg)
		}
		return xe.code
	}
	fmt.Fprintln(e.stderr, "dsh:", err)
	return 1
}

func run(ctx context.Context, e *env) error {
	if len(e.args) == 0 {
		usage(e.stderr)
		return &exitError{code: 2}
	}
	if buildinfo.Requested(e.args) || e.args[0] == "version" {
		fmt.Fprintln(e.stdout, buildinfo.String("dsh"))
		return nil
	}
	name := e.args[0]
	if name != "dev" {
		// Only dev's start keeps the heap's huge-page mark this package's
		// import set (internal/hugeheap); it ends with the start.
		hugeheap.End()
	}
	if name == "-h" || name == "--help" || name == "help" {
		usage(e.stdout)
		return nil
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, e, e.args[1:])
		}
	}
	usage(e.stderr)
	return &exitError{code: 2, msg: fmt.Sprintf("unknown command %q", name)}
}
