package approval

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// ShellTool is the tool whose rules match the command line.
const ShellTool = "bash"

// RuleError names a malformed rule.
type RuleError struct {
	Field string // e.g. "options.approval_rules[2]"
	Rule  *sessionv1.ApprovalRule
	Msg   string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.Field, FormatRule(e.Rule), e.Msg)
}

// ValidateRules checks every rule: a tool name, a known action, and a
// pattern that compiles. field names the list in messages.
func ValidateRules(field string, rules []*sessionv1.ApprovalRule) error {
	for i, r := range rules {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case r == nil:
			return &RuleError{Field: f, Rule: r, Msg: "the rule is empty"}
		case strings.TrimSpace(r.GetTool()) == "":
			return &RuleError{Field: f, Rule: r, Msg: `the rule needs a tool name ("*" matches every tool)`}
		case r.GetTool() != strings.TrimSpace(r.GetTool()) || strings.ContainsAny(r.GetTool(), "()= \t\n"):
			return &RuleError{Field: f, Rule: r, Msg: "the tool name must not contain spaces, parentheses or '='"}
		}
		switch r.GetAction() {
		case sessionv1.RuleAction_RULE_ACTION_ALLOW, sessionv1.RuleAction_RULE_ACTION_ASK, sessionv1.RuleAction_RULE_ACTION_DENY:
		default:
			return &RuleError{Field: f, Rule: r, Msg: "the action must be allow, ask or deny"}
		}
		if _, err := compileGlob(r.GetPattern()); err != nil {
			return &RuleError{Field: f, Rule: r, Msg: "bad pattern: " + err.Error()}
		}
	}
	return nil
}

// FormatRule is a rule's text form: "bash(git push*) ask", "write allow".
func FormatRule(r *sessionv1.ApprovalRule) string {
	s := r.GetTool()
	if r.GetPattern() != "" {
		s += "(" + r.GetPattern() + ")"
	}
	return s + " " + ActionName(r.GetAction())
}

// ActionName is "allow", "ask", "deny" (or "unspecified").
func ActionName(a sessionv1.RuleAction) string {
	switch a {
	case sessionv1.RuleAction_RULE_ACTION_ALLOW:
		return "allow"
	case sessionv1.RuleAction_RULE_ACTION_ASK:
		return "ask"
	case sessionv1.RuleAction_RULE_ACTION_DENY:
		return "deny"
	}
	return "unspecified"
}

// ParseRule parses the flag form TOOL[(PATTERN)]=ACTION, e.g.
// "bash(git status*)=allow", "write=ask", "*=allow".
func ParseRule(s string) (*sessionv1.ApprovalRule, error) {
	i := strings.LastIndex(s, "=")
	if i < 0 {
		return nil, fmt.Errorf("approval rule %q: want TOOL[(PATTERN)]=allow|ask|deny", s)
	}
	head, action := s[:i], s[i+1:]
	r := &sessionv1.ApprovalRule{Tool: head}
	if j := strings.Index(head, "("); j >= 0 {
		if !strings.HasSuffix(head, ")") {
			return nil, fmt.Errorf("approval rule %q: the pattern must be closed with ')'", s)
		}
		r.Tool, r.Pattern = head[:j], head[j+1:len(head)-1]
	}
	a, ok := ParseAction(action)
	if !ok {
		return nil, fmt.Errorf("approval rule %q: the action must be allow, ask or deny, got %q", s, action)
	}
	r.Action = a
	if err := ValidateRules("approval rule", []*sessionv1.ApprovalRule{r}); err != nil {
		return nil, err
	}
	return r, nil
}

// ParseAction parses "allow", "ask", "deny".
func ParseAction(s string) (sessionv1.RuleAction, bool) {
	switch s {
	case "allow":
		return sessionv1.RuleAction_RULE_ACTION_ALLOW, true
	case "ask":
		return sessionv1.RuleAction_RULE_ACTION_ASK, true
	case "deny":
		return sessionv1.RuleAction_RULE_ACTION_DENY, true
	}
	return 0, false
}

// ParsePolicy parses "never", "on-request" (or "on_request"), "always".
func ParsePolicy(s string) (sessionv1.ApprovalPolicy, bool) {
	switch s {
	case "never":
		return sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER, true
	case "on-request", "on_request":
		return sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, true
	case "always":
		return sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS, true
	}
	return 0, false
}

// PolicyName is "never", "on-request", "always" ("" when unset).
func PolicyName(p sessionv1.ApprovalPolicy) string {
	switch p {
	case sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER:
		return "never"
	case sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST:
		return "on-request"
	case sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS:
		return "always"
	}
	return ""
}

// compileGlob compiles a rule pattern: '*' matches any run of characters
// ('/' and spaces included), '?' one character, '[...]' a class ('[!...]'
// negated), and '\' escapes the next character. The empty pattern matches
// everything.
func compileGlob(p string) (*regexp.Regexp, error) {
	if p == "" {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString(`\A(?s:`)
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '\\':
			if i+1 == len(p) {
				return nil, fmt.Errorf("a trailing '\\' escapes nothing")
			}
			_, n := utf8.DecodeRuneInString(p[i+1:])
			b.WriteString(regexp.QuoteMeta(p[i+1 : i+1+n]))
			i += n
		case '[':
			j := strings.IndexByte(p[i+1:], ']')
			if j < 0 {
				return nil, fmt.Errorf("'[' at byte %d is never closed", i)
			}
			class := p[i+1 : i+1+j]
			if class == "" || class == "!" {
				return nil, fmt.Errorf("the class at byte %d is empty", i)
			}
			b.WriteByte('[')
			if class[0] == '!' {
				b.WriteByte('^')
				class = class[1:]
			}
			b.WriteString(strings.NewReplacer(`\`, `\\`, `[`, `\[`, `^`, `\^`).Replace(class))
			b.WriteByte(']')
			i += j + 1
		default:
			_, n := utf8.DecodeRuneInString(p[i:])
			b.WriteString(regexp.QuoteMeta(p[i : i+n]))
			i += n - 1
		}
	}
	b.WriteString(`)\z`)
	return regexp.Compile(b.String())
}

// EscapeGlob quotes s so that it matches only itself as a rule pattern.
func EscapeGlob(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`).Replace(s)
}

// Subject is the salient input of a call that rule patterns match.
type Subject struct {
	Tool string
	// Input: the command for bash, the cleaned absolute path for tools with
	// a file_path or path argument; "" otherwise.
	Input string
	// Compound: a shell command with control operators, redirections or
	// substitutions (an allow rule never matches it: "git status; rm -rf ~"
	// must not pass as "git status*").
	Compound bool
	// Alt: another reading of the subject, when it differs from Input: for
	// bash the command as the shell reads its words (quotes, backslashes
	// and line continuations removed, blanks collapsed, ends trimmed:
	// `'r'm  -rf /` is rm -rf /); for a tool declaring both path keys the
	// other one's path. A stricter pattern rule that matches it decides.
	Alt string
	// Folded: a key of the arguments that differs from the subject's key
	// only in case ("COMMAND", "File_Path"); a decoder that ignores case
	// may take it for the key, so the gate refuses the call.
	Folded string
	cwd    string
}

// The path keys SubjectFor reads (PathKeyOf of a tool's schema).
const (
	// PathKeyUnknown: the tool's schema is not known; the first of
	// "file_path" and "path" the arguments carry is the path.
	PathKeyUnknown = ""
	// PathKeyNone: the tool declares neither; it has no path subject.
	PathKeyNone = "-"
	// PathKeyFile: the tool reads "file_path".
	PathKeyFile = "file_path"
	// PathKeyDir: the tool reads "path", the session's working directory
	// when it is absent (the built-in grep and glob).
	PathKeyDir = "path"
	// PathKeyBoth: the tool declares both; either may be its path, and
	// the stricter decision of the two applies.
	PathKeyBoth = "file_path+path"
)

// PathKeyOf is the path key a tool's JSON Schema parameters declare:
// PathKeyFile when its properties have "file_path", else PathKeyDir when
// they have "path", else PathKeyNone; PathKeyUnknown for parameters that
// declare no properties at all (a free-form object, which may read any
// key) or are not a JSON object schema.
func PathKeyOf(parameters string) string {
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal([]byte(parameters), &schema) != nil || len(schema.Properties) == 0 {
		return PathKeyUnknown
	}
	_, file := schema.Properties[PathKeyFile]
	_, dir := schema.Properties[PathKeyDir]
	switch {
	case file && dir:
		return PathKeyBoth
	case file:
		return PathKeyFile
	case dir:
		return PathKeyDir
	}
	return PathKeyNone
}

// SubjectFor extracts a call's subject, its path read from pathKey (see
// PathKeyOf): the path the tool will use, not a decoy under a key the
// tool ignores ({"pattern":"x","file_path":"allowed/a"} for a grep that
// searches its "path", absent here: the working directory).
func SubjectFor(tool, arguments, cwd, pathKey string) Subject {
	s := Subject{Tool: tool, cwd: cwd}
	var args map[string]any
	if json.Unmarshal([]byte(arguments), &args) != nil {
		return s
	}
	if tool == ShellTool {
		s.Input, _ = args["command"].(string)
		s.Compound = strings.ContainsAny(s.Input, ";&|`$<>\n\r()")
		if w := shellWords(s.Input); w != s.Input {
			s.Alt = w
		}
		s.Folded = folded(args, "command")
		return s
	}
	str := func(k string) string {
		if v, ok := args[k].(string); ok && v != "" {
			return resolvePath(v, cwd)
		}
		return ""
	}
	switch pathKey {
	case PathKeyNone:
	case PathKeyFile:
		s.Input, s.Folded = str(PathKeyFile), folded(args, PathKeyFile)
	case PathKeyDir:
		// Absent (or null, or empty): the working directory; a value of
		// another type names no path.
		if v, ok := args[PathKeyDir]; (!ok || v == nil || v == "") && cwd != "" {
			s.Input = resolvePath(cwd, cwd)
		} else {
			s.Input = str(PathKeyDir)
		}
		s.Folded = folded(args, PathKeyDir)
	case PathKeyBoth:
		s.Input, s.Alt = str(PathKeyFile), str(PathKeyDir)
		if s.Input == "" || s.Alt == s.Input {
			s.Input, s.Alt = s.Alt, ""
		}
		s.Folded = cmp.Or(folded(args, PathKeyFile), folded(args, PathKeyDir))
	default: // PathKeyUnknown: the first of the two the arguments carry
		s.Input = cmp.Or(str(PathKeyFile), str(PathKeyDir))
		s.Folded = cmp.Or(folded(args, PathKeyFile), folded(args, PathKeyDir))
	}
	return s
}

// folded is a key of args other than key that equals it when case is
// ignored (as encoding/json and other case-insensitive decoders match
// keys), or "".
func folded(args map[string]any, key string) string {
	for k := range args {
		if k != key && strings.EqualFold(k, key) {
			return k
		}
	}
	return ""
}

func resolvePath(p, cwd string) string {
	if !filepath.IsAbs(p) && cwd != "" {
		p = filepath.Join(cwd, p)
	}
	return filepath.Clean(p)
}

// patternCache keeps compiled patterns (rules are evaluated on every tool
// call; compiling dominates otherwise). The zero value is ready; it is
// cleared when it grows past a bound.
type patternCache struct {
	mu sync.Mutex
	m  map[string]*regexp.Regexp
}

func (c *patternCache) compile(p string) (*regexp.Regexp, error) {
	if c == nil {
		return compileGlob(p)
	}
	c.mu.Lock()
	re, ok := c.m[p]
	c.mu.Unlock()
	if ok {
		return re, nil
	}
	re, err := compileGlob(p)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= 4096 {
		c.m = map[string]*regexp.Regexp{}
	}
	c.m[p] = re
	c.mu.Unlock()
	return re, nil
}

// Matches reports whether rule r matches the subject. Path patterns of
// non-shell tools are resolved against the session's cwd like the path.
func Matches(r *sessionv1.ApprovalRule, s Subject) bool { return matches(nil, r, s) }

func matches(cache *patternCache, r *sessionv1.ApprovalRule, s Subject) bool {
	if r.GetTool() != "*" && r.GetTool() != s.Tool {
		return false
	}
	if r.GetPattern() == "" {
		return true
	}
	if s.Input == "" {
		return false
	}
	pat := r.GetPattern()
	if s.Tool != ShellTool && !filepath.IsAbs(pat) && !strings.HasPrefix(pat, "*") && s.cwd != "" {
		// A relative path pattern is relative to the session's cwd, like a
		// relative path argument (which SubjectFor resolved and cleaned, so
		// "src/../../etc/passwd" cannot pass as "src/*").
		pat = EscapeGlob(filepath.Clean(s.cwd)) + "/" + pat
	}
	re, err := cache.compile(pat)
	if err != nil || re == nil {
		return err == nil
	}
	if s.Compound && r.GetAction() == sessionv1.RuleAction_RULE_ACTION_ALLOW {
		// A wildcard allow never covers a compound command; an exact one
		// (an ALLOW_FOR_SESSION rule) may.
		if hasWildcard(r.GetPattern()) {
			return false
		}
	}
	return re.MatchString(s.Input)
}

// Decision is the outcome of evaluating the rules.
type Decision struct {
	Action sessionv1.RuleAction
	// Rule is the text form of the deciding rule ("" when none matched).
	Rule string
}

// Evaluate returns the action of the first rule matching the subject,
// across the lists in order, or allow when none matches.
func Evaluate(s Subject, lists ...[]*sessionv1.ApprovalRule) Decision {
	return evaluate(nil, s, lists...)
}

func evaluate(cache *patternCache, s Subject, lists ...[]*sessionv1.ApprovalRule) Decision {
	d, r := first(cache, s, lists)
	if s.Alt == "" || (s.Tool == ShellTool && r.GetAction() == sessionv1.RuleAction_RULE_ACTION_ALLOW && r.GetPattern() != "" && !hasWildcard(r.GetPattern())) {
		// An exact allow (ALLOW_FOR_SESSION's) was given for this very
		// command: its shell reading is what was approved. (A tool's second
		// path is another path, never covered by the first one's allow.)
		return d
	}
	// A pattern rule that the other reading matches, and that is stricter
	// than what decided, decides: `"rm" -rf /` and `rm<TAB>-rf /` are
	// caught by bash(rm *)=deny. (A rule without a pattern matched the
	// subject itself already.)
	// For a tool's second path (another path, not another reading) any
	// stricter rule decides.
	w := s
	w.Input = s.Alt
	if d2, r2 := first(cache, w, lists); (r2.GetPattern() != "" || s.Tool != ShellTool) && strictness(d2.Action) > strictness(d.Action) {
		return d2
	}
	return d
}

// first is the decision of the first rule matching s, across the lists
// in order, with the rule (nil when none matched: allow).
func first(cache *patternCache, s Subject, lists [][]*sessionv1.ApprovalRule) (Decision, *sessionv1.ApprovalRule) {
	for _, rules := range lists {
		for _, r := range rules {
			if matches(cache, r, s) {
				return Decision{Action: r.GetAction(), Rule: FormatRule(r)}, r
			}
		}
	}
	return Decision{Action: sessionv1.RuleAction_RULE_ACTION_ALLOW}, nil
}

// strictness orders actions: allow < ask < deny.
func strictness(a sessionv1.RuleAction) int {
	switch a {
	case sessionv1.RuleAction_RULE_ACTION_DENY:
		return 2
	case sessionv1.RuleAction_RULE_ACTION_ASK:
		return 1
	}
	return 0
}

// shellWords is a command as the shell reads its words for matching: quote
// characters and escaping backslashes removed, runs of blanks (space, tab)
// one space, the ends trimmed. It is a reading for rules, not a parser:
// what it cannot see (variables, substitutions, redirections) makes the
// command Compound.
func shellWords(cmd string) string {
	var b strings.Builder
	blank := false
	for i := 0; i < len(cmd); i++ {
		c := cmd[i]
		switch {
		case c == '\\' && i+1 < len(cmd):
			i++
			if cmd[i] == '\n' { // a line continuation: both go
				continue
			}
			c = cmd[i]
		case c == '\'' || c == '"':
			continue
		case c == ' ' || c == '\t':
			blank = true
			continue
		}
		if blank && b.Len() > 0 {
			b.WriteByte(' ')
		}
		blank = false
		b.WriteByte(c)
	}
	return b.String()
}

// SessionRule is the rule an ALLOW_FOR_SESSION answer adds: the exact
// command for bash (so the same command runs without asking), the whole
// tool otherwise.
func SessionRule(s Subject) *sessionv1.ApprovalRule {
	r := &sessionv1.ApprovalRule{Tool: s.Tool, Action: sessionv1.RuleAction_RULE_ACTION_ALLOW}
	if s.Tool == ShellTool && s.Input != "" {
		r.Pattern = EscapeGlob(s.Input)
	}
	return r
}

// hasWildcard reports whether a pattern has an unescaped '*', '?' or '['.
func hasWildcard(p string) bool {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '*', '?', '[':
			return true
		}
	}
	return false
}
