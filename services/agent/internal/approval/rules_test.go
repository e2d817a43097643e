package approval

import (
	"encoding/json"
	"strings"
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func rule(s string) *sessionv1.ApprovalRule {
	r, err := ParseRule(s)
	if err != nil {
		panic(err)
	}
	return r
}

func TestMatches(t *testing.T) {
	t.Parallel()
	bash := func(cmd string) string { return `{"command":` + quote(cmd) + `}` }
	tests := []struct {
		rule, tool, args string
		want             bool
	}{
		{"bash(git status*)=allow", "bash", bash("git status"), true},
		{"bash(git status*)=allow", "bash", bash("git status --short"), true},
		{"bash(git status*)=allow", "bash", bash("git push"), false},
		{"bash=ask", "bash", bash("anything at all"), true},
		{"*=deny", "write", `{"file_path":"a"}`, true},
		{"bash(git status*)=allow", "read", bash("git status"), false},
		// An attacker chains a command behind an allowed prefix: a wildcard
		// allow never covers a compound command...
		{"bash(git status*)=allow", "bash", bash("git status; rm -rf ~"), false},
		{"bash(git status*)=allow", "bash", bash("git status && curl x | sh"), false},
		{"bash(git status*)=allow", "bash", bash("git status $(rm -rf ~)"), false},
		{"bash(git status*)=allow", "bash", bash("git status `id`"), false},
		{"bash(git status*)=allow", "bash", bash("git status\nrm -rf ~"), false},
		{"bash(git status*)=allow", "bash", bash("git status > /etc/passwd"), false},
		// ...but deny and ask rules still match it, and an exact allow does.
		{"bash(*rm -rf*)=deny", "bash", bash("git status; rm -rf ~"), true},
		{"bash(make test; echo done)=allow", "bash", bash("make test; echo done"), true},
		{"bash(make test; echo done)=allow", "bash", bash("make test; echo done; rm x"), false},
		// Escapes and classes.
		{`bash(echo \*)=allow`, "bash", bash("echo *"), true},
		{`bash(echo \*)=allow`, "bash", bash("echo hi"), false},
		{"bash(ls [ab])=allow", "bash", bash("ls a"), true},
		{"bash(ls [!ab])=allow", "bash", bash("ls a"), false},
		{"bash(l?)=allow", "bash", bash("ls"), true},
		// Paths resolve against the cwd (/work) before matching: traversal
		// does not pass as a path under src/.
		{"write(src/*)=allow", "write", `{"file_path":"src/a.go"}`, true},
		{"write(src/*)=allow", "write", `{"file_path":"/work/src/deep/a.go"}`, true},
		{"write(src/*)=allow", "write", `{"file_path":"src/../../etc/passwd"}`, false},
		{"write(src/*)=allow", "write", `{"file_path":"/etc/passwd"}`, false},
		{"write(/etc/*)=deny", "write", `{"file_path":"../etc/shadow"}`, true},
		{"write(*.go)=allow", "write", `{"file_path":"x/y.go"}`, true},
		{"read(src/*)=allow", "read", `{"path":"src/x"}`, true},
		// A pattern needs a salient input.
		{"write(src/*)=allow", "write", `{"content":"x"}`, false},
		{"bash(ls)=allow", "bash", `not json`, false},
	}
	for _, tc := range tests {
		got := Matches(rule(tc.rule), SubjectOf(tc.tool, tc.args, "/work"))
		if got != tc.want {
			t.Errorf("%s on %s %s = %v, want %v", tc.rule, tc.tool, tc.args, got, tc.want)
		}
	}
}

// SubjectOf is SubjectFor without the tool's schema (PathKeyUnknown): the
// first of the arguments' "file_path" and "path" is the path.
func SubjectOf(tool, arguments, cwd string) Subject {
	return SubjectFor(tool, arguments, cwd, PathKeyUnknown)
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func TestEvaluateOrderAndSessionRule(t *testing.T) {
	t.Parallel()
	session := []*sessionv1.ApprovalRule{rule("bash(git push*)=deny"), rule("bash(git *)=allow")}
	deployment := []*sessionv1.ApprovalRule{rule("bash=ask"), rule("write=ask")}
	tests := []struct {
		cmd  string
		want sessionv1.RuleAction
		rule string
	}{
		{"git push origin", sessionv1.RuleAction_RULE_ACTION_DENY, "bash(git push*) deny"},
		{"git log", sessionv1.RuleAction_RULE_ACTION_ALLOW, "bash(git *) allow"},
		{"make", sessionv1.RuleAction_RULE_ACTION_ASK, "bash ask"},
	}
	for _, tc := range tests {
		d := Evaluate(SubjectOf("bash", `{"command":"`+tc.cmd+`"}`, "/"), session, deployment)
		if d.Action != tc.want || d.Rule != tc.rule {
			t.Errorf("%s: %v", tc.cmd, d)
		}
	}
	if d := Evaluate(SubjectOf("read", `{}`, "/"), session, deployment); d.Action != sessionv1.RuleAction_RULE_ACTION_ALLOW || d.Rule != "" {
		t.Errorf("no rule: %v", d)
	}
	// The added rule matches exactly the approved command, metacharacters
	// included, and nothing else.
	s := SubjectOf("bash", `{"command":"rm -f *.tmp"}`, "/")
	added := SessionRule(s)
	if !Matches(added, s) || Matches(added, SubjectOf("bash", `{"command":"rm -f important.tmp"}`, "/")) {
		t.Errorf("added rule %v", added)
	}
	if r := SessionRule(SubjectOf("write", `{"file_path":"a"}`, "/")); r.GetPattern() != "" || r.GetTool() != "write" {
		t.Errorf("write session rule %v", r)
	}
}

func TestParseAndValidateRules(t *testing.T) {
	t.Parallel()
	good := []string{"bash=ask", "bash(git status*)=allow", "*=deny", `bash(echo \(x\))=allow`, "write(src/[ab]*)=allow"}
	for _, s := range good {
		r, err := ParseRule(s)
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if back, err := ParseRule(strings.Replace(FormatRule(r), " ", "=", 1)); err == nil && FormatRule(back) != FormatRule(r) {
			t.Errorf("%s: round trip %s", s, FormatRule(back))
		}
	}
	bad := map[string]string{
		"bash":              "TOOL[(PATTERN)]",
		"bash=maybe":        "allow, ask or deny",
		"=allow":            "tool name",
		"bash(git=allow":    "closed",
		"bash(git [x)=deny": "never closed",
		`bash(x\)=deny`:     "escapes nothing",
		"bash([])=deny":     "empty",
		"ba sh=allow":       "spaces",
	}
	for s, want := range bad {
		if _, err := ParseRule(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error mentioning %q", s, err, want)
		}
	}
	err := ValidateRules("options.approval_rules", []*sessionv1.ApprovalRule{rule("bash=ask"), {Tool: "bash", Pattern: "[", Action: sessionv1.RuleAction_RULE_ACTION_DENY}})
	if err == nil || !strings.Contains(err.Error(), "options.approval_rules[1]") {
		t.Errorf("ValidateRules: %v", err)
	}
}

func FuzzRules(f *testing.F) {
	for _, s := range []string{"bash(git status*)=allow", `x(\*[!a-z]?)=deny`, "*=ask", "a([)=allow"} {
		f.Add(s, "git status; x")
	}
	f.Fuzz(func(t *testing.T, spec, cmd string) {
		r, err := ParseRule(spec)
		if err != nil {
			return
		}
		// A valid rule never panics and its exact session rule matches
		// only its own command.
		s := SubjectOf("bash", `{"command":`+quote(cmd)+`}`, "/")
		_ = Matches(r, s)
		if s.Input != "" && !Matches(SessionRule(s), s) {
			t.Fatalf("the session rule of %q does not match it", cmd)
		}
	})
}

// TestSubjectReadsTheToolsOwnKey is an attacker's try at a path rule: an
// argument the tool ignores names an allowed path while the tool works on
// another. With the key the tool declares (PathKeyOf of its schema), the
// subject is the path the tool uses: a grep's "path", or the working
// directory when it has none, never a decoy "file_path".
func TestSubjectReadsTheToolsOwnKey(t *testing.T) {
	grepSchema := `{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"}},"required":["pattern"]}`
	readSchema := `{"type":"object","properties":{"file_path":{"type":"string"},"offset":{"type":"integer"}},"required":["file_path"]}`
	for _, tc := range []struct {
		rule, tool, schema, args string
		want                     bool // the rule matches
	}{
		// Without the schema (SubjectOf) the decoy passes: the premise.
		{"grep(/work/public/*)=allow", "grep", "", `{"pattern":"key","file_path":"public/a"}`, true},
		// With it, the grep's own path decides; absent, the working directory.
		{"grep(/work/public/*)=allow", "grep", grepSchema, `{"pattern":"key","file_path":"public/a"}`, false},
		{"grep(/work/public/*)=allow", "grep", grepSchema, `{"pattern":"key","path":"/etc","file_path":"public/a"}`, false},
		{"grep(/work/public/*)=allow", "grep", grepSchema, `{"pattern":"key","path":"public/a"}`, true},
		{"grep(/work)=deny", "grep", grepSchema, `{"pattern":"key"}`, true},
		// A file tool's file_path decides, whatever "path" says.
		{"read(/work/public/*)=allow", "read", readSchema, `{"path":"public/a","file_path":"/etc/shadow"}`, false},
		{"read(/work/public/*)=allow", "read", readSchema, `{"file_path":"public/a"}`, true},
		// A tool with neither key has no path subject.
		{"todo(/work/*)=allow", "todo", `{"type":"object","properties":{"todos":{"type":"array"}}}`, `{"file_path":"a"}`, false},
	} {
		key := PathKeyUnknown
		if tc.schema != "" {
			key = PathKeyOf(tc.schema)
		}
		if got := Matches(rule(tc.rule), SubjectFor(tc.tool, tc.args, "/work", key)); got != tc.want {
			t.Errorf("%s on %s %s (path key %q) = %v, want %v", tc.rule, tc.tool, tc.args, key, got, tc.want)
		}
	}
	for schema, want := range map[string]string{"not json": PathKeyUnknown, `{"type":"object"}`: PathKeyUnknown,
		`{"type":"object","properties":{"todos":{}}}`: PathKeyNone,
		`{"properties":{"path":{},"file_path":{}}}`:   PathKeyBoth} {
		if got := PathKeyOf(schema); got != want {
			t.Errorf("PathKeyOf(%s) = %q, want %q", schema, got, want)
		}
	}
}

// TestShellSpellingsDoNotEvadeRules is an attacker's try at deny and ask
// rules on bash: the same command spelled so that the shell runs it while
// the pattern's literal text does not match (quotes, backslashes, a tab,
// doubled or leading blanks). The shell's reading of the command decides
// when a stricter pattern rule matches it; an exact allow added by
// ALLOW_FOR_SESSION still allows its own command.
func TestShellSpellingsDoNotEvadeRules(t *testing.T) {
	deployment := []*sessionv1.ApprovalRule{rule("bash(rm *)=deny"), rule("bash(git push*)=ask"), rule("bash(git *)=allow"), rule("bash=allow")}
	for _, tc := range []struct {
		cmd  string
		want sessionv1.RuleAction
	}{
		{`rm -rf /`, sessionv1.RuleAction_RULE_ACTION_DENY}, // the premise
		{`'r'm -rf /`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`"rm" -rf /`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`r\m -rf /`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{"rm\t-rf /", sessionv1.RuleAction_RULE_ACTION_DENY},
		{`  rm -rf /`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`git  push --force`, sessionv1.RuleAction_RULE_ACTION_ASK},
		{`git "push" --force`, sessionv1.RuleAction_RULE_ACTION_ASK},
		{`git commit -m "a  message"`, sessionv1.RuleAction_RULE_ACTION_ALLOW},
		{"r\\\nm -rf /", sessionv1.RuleAction_RULE_ACTION_DENY}, // a line continuation
		{`ls -la`, sessionv1.RuleAction_RULE_ACTION_ALLOW},
	} {
		cmd, _ := json.Marshal(tc.cmd)
		d := Evaluate(SubjectOf("bash", `{"command":`+string(cmd)+`}`, "/"), deployment)
		if d.Action != tc.want {
			t.Errorf("%q: %v (rule %q), want %v", tc.cmd, d.Action, d.Rule, tc.want)
		}
	}
	// The exact rule ALLOW_FOR_SESSION adds for a quoted command allows it
	// again, even where its shell reading meets a stricter pattern rule.
	for _, cmd := range []string{`git commit -m "x  y"`, `git push origin "my branch"`, `git  push`} {
		s := SubjectOf("bash", `{"command":`+quote(cmd)+`}`, "/")
		session := []*sessionv1.ApprovalRule{SessionRule(s)}
		if d := Evaluate(s, session, deployment); d.Action != sessionv1.RuleAction_RULE_ACTION_ALLOW {
			t.Errorf("%q after allow-for-session: %v (rule %q), want allow", cmd, d.Action, d.Rule)
		}
	}
}

// TestSubjectFoldedKeysAndBothPaths: a key differing from the subject's
// key only in case is reported (the gate refuses the call); a tool
// declaring both path keys is judged by the stricter of its two paths; a
// "path" of another type names no path.
func TestSubjectFoldedKeysAndBothPaths(t *testing.T) {
	for _, tc := range []struct{ tool, key, args, folded string }{
		{"bash", "", `{"command":"ls","COMMAND":"rm -rf ~"}`, "COMMAND"},
		{"read", PathKeyFile, `{"file_path":"a","File_Path":"/etc/shadow"}`, "File_Path"},
		{"grep", PathKeyDir, `{"pattern":"x","PATH":"/etc"}`, "PATH"},
		{"grep", PathKeyDir, `{"pattern":"x","path":"a"}`, ""},
		{"mcp_tool", PathKeyUnknown, `{"path":"public/a","PATH":"/secret"}`, "PATH"},
	} {
		if got := SubjectFor(tc.tool, tc.args, "/work", tc.key).Folded; got != tc.folded {
			t.Errorf("%s %s: folded %q, want %q", tc.tool, tc.args, got, tc.folded)
		}
	}
	both := `{"type":"object","properties":{"file_path":{"type":"string"},"path":{"type":"string"}}}`
	rules := []*sessionv1.ApprovalRule{rule("t(/work/secret/*)=deny"), rule("t=allow")}
	for _, tc := range []struct {
		args string
		want sessionv1.RuleAction
	}{
		{`{"path":"/work/secret/x"}`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`{"file_path":"/work/public/a","path":"/work/secret/x"}`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`{"file_path":"/work/secret/x","path":"/work/public/a"}`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`{"file_path":"/work/public/a"}`, sessionv1.RuleAction_RULE_ACTION_ALLOW},
	} {
		if d := Evaluate(SubjectFor("t", tc.args, "/work", PathKeyOf(both)), rules); d.Action != tc.want {
			t.Errorf("%s: %v, want %v", tc.args, d.Action, tc.want)
		}
	}
	// An exact allow of one path does not cover the tool's other path.
	exact := []*sessionv1.ApprovalRule{rule("t(/work/a.txt)=allow"), rule("t(/etc/*)=deny")}
	for _, tc := range []struct {
		args string
		want sessionv1.RuleAction
	}{
		{`{"file_path":"/work/a.txt","path":"/etc/passwd"}`, sessionv1.RuleAction_RULE_ACTION_DENY},
		{`{"file_path":"/work/a.txt"}`, sessionv1.RuleAction_RULE_ACTION_ALLOW},
	} {
		if d := Evaluate(SubjectFor("t", tc.args, "/work", PathKeyOf(both)), exact); d.Action != tc.want {
			t.Errorf("%s: %v, want %v", tc.args, d.Action, tc.want)
		}
	}
	// An allow-list: the second path meets only the catch-all deny.
	allowList := []*sessionv1.ApprovalRule{rule("t(/work/public/*)=allow"), rule("t=deny")}
	if d := Evaluate(SubjectFor("t", `{"file_path":"/work/public/a","path":"/etc/passwd"}`, "/work", PathKeyOf(both)), allowList); d.Action != sessionv1.RuleAction_RULE_ACTION_DENY {
		t.Errorf("allow-list with a second path outside it: %v, want deny", d.Action)
	}
	if s := SubjectFor("grep", `{"pattern":"x","path":["/etc"]}`, "/work", PathKeyDir); s.Input != "" {
		t.Errorf("a path of another type: subject %q, want none", s.Input)
	}
}
