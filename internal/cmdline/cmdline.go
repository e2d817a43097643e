// Package cmdline holds the command-line conventions shared by the service
// binaries (agent, llmgateway, toolhost, mcpbridge) and the dsh CLI: they
// take flags only, so a stray argument — which would silently end flag
// parsing and drop every flag after it — is refused with a message naming
// it; and their flags default from environment variables (Env), whose
// values are parsed as strictly as the flags': a value that does not parse
// is refused with a message naming the variable, never replaced by the
// default.
package cmdline

import (
	"flag"
	"fmt"
	"path/filepath"
)

// NoArgs returns an error when fs, after Parse, holds a positional
// argument.
func NoArgs(fs *flag.FlagSet) error {
	if fs.NArg() == 0 {
		return nil
	}
	return fmt.Errorf("unexpected argument %q: %s takes flags only (the flags after it were not read; see --help)", fs.Arg(0), filepath.Base(fs.Name()))
}

// Parse parses args into fs, then refuses a stray argument (NoArgs) and
// the environment variables env found malformed while the flags were
// registered (env.Err): the one check every service binary makes before
// it acts on its flags.
func Parse(fs *flag.FlagSet, args []string, env *Env) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := NoArgs(fs); err != nil {
		return err
	}
	return env.Err()
}
