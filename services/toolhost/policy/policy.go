// Package policy is a rule-based command policy for the bash tool, served as
// a dsh.tools.v1.ToolInterceptor: before a bash call runs, its command is
// matched against an ordered list of rules read from a file, and the first
// matching rule decides allow, deny (the model sees the reason) or ask (a
// human approves). A command no rule matches is allowed.
//
// The file has one rule per line, `#` starting a comment line:
//
//	# action  regexp (RE2, matched against the command with runs of
//	#         whitespace collapsed to one space)
//	allow   ^rm -rf \./build(\s|$)
//	deny    \brm\s+(-[a-zA-Z]*[rf][a-zA-Z]*\s+)+/(\s|\*|$)
//	ask     \bgit\s+push\b
//
// Earlier rules win, so put narrow allow rules before broad deny rules. The
// policy is a guard rail against accidents, not a sandbox: a determined
// command can always be written so no pattern matches it.
package policy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// Action is what a matching rule decides.
type Action string

// Actions.
const (
	Allow Action = "allow"
	Deny  Action = "deny"
	Ask   Action = "ask"
)

// Rule is one line of a policy file.
type Rule struct {
	Action  Action
	Pattern *regexp.Regexp
	// Line is the 1-based line in the file.
	Line int
}

// Policy is an ordered rule list applied to the named tools' "command"
// argument.
type Policy struct {
	Rules []Rule
	// Tools are the tools whose calls are checked; default ["bash"].
	Tools []string
}

// Parse reads a policy file. Every malformed line is reported, by number.
func Parse(r io.Reader) (*Policy, error) {
	p := &Policy{Tools: []string{"bash"}}
	var errs []error
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		act, pat := line, ""
		if i := strings.IndexAny(line, " \t"); i >= 0 {
			act, pat = line[:i], line[i+1:]
		}
		pat = strings.TrimSpace(pat)
		a := Action(strings.ToLower(act))
		if !slices.Contains([]Action{Allow, Deny, Ask}, a) {
			errs = append(errs, fmt.Errorf("line %d: action %q is not allow, deny or ask", n, act))
			continue
		}
		if pat == "" {
			errs = append(errs, fmt.Errorf("line %d: missing pattern after %q", n, act))
			continue
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		p.Rules = append(p.Rules, Rule{Action: a, Pattern: re, Line: n})
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// Load reads a policy file from disk.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	p, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	return p, nil
}

var spaces = regexp.MustCompile(`\s+`)

// Decide returns the first matching rule's decision for a command, or allow.
func (p *Policy) Decide(command string) *toolsv1.PreToolDecision {
	norm := strings.TrimSpace(spaces.ReplaceAllString(command, " "))
	for _, r := range p.Rules {
		if !r.Pattern.MatchString(norm) {
			continue
		}
		reason := fmt.Sprintf("command blocked by policy rule %d (%s %s)", r.Line, r.Action, r.Pattern)
		switch r.Action {
		case Deny:
			return toolsdk.Deny(reason)
		case Ask:
			return toolsdk.Ask(fmt.Sprintf("command matches policy rule %d (%s %s)", r.Line, r.Action, r.Pattern))
		default:
			return toolsdk.Allow()
		}
	}
	return toolsdk.Allow()
}

// Interceptor serves the policy as a ToolInterceptor. Calls of other tools
// and calls whose arguments carry no command are allowed (the host rejects
// malformed arguments itself).
func (p *Policy) Interceptor() *toolsdk.Interceptor {
	return toolsdk.NewInterceptor(func(_ context.Context, ex *toolsv1.ToolExecution) (*toolsv1.PreToolDecision, error) {
		if !slices.Contains(p.Tools, ex.GetName()) {
			return toolsdk.Allow(), nil
		}
		var args struct {
			Command string `json:"command"`
		}
		if json.Unmarshal([]byte(ex.GetArguments()), &args) != nil || args.Command == "" {
			return toolsdk.Allow(), nil
		}
		return p.Decide(args.Command), nil
	}, nil)
}
