package approval

import (
	"testing"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// BenchmarkApproveAllowed is the approval stage's cost on a call that runs
// without asking (the common case, paid on every tool call): the default
// rules only, and ten session rules with patterns ahead of them.
func BenchmarkApproveAllowed(b *testing.B) {
	for _, bc := range []struct {
		name  string
		rules []*sessionv1.ApprovalRule
	}{
		{"default_rules", nil},
		{"ten_pattern_rules", func() []*sessionv1.ApprovalRule {
			var rs []*sessionv1.ApprovalRule
			for _, s := range []string{"git push*", "git status*", "rm *", "curl *", "make *", "go test*", "ls*", "cat *", "npm *", "docker *"} {
				rs = append(rs, &sessionv1.ApprovalRule{Tool: "bash", Pattern: s, Action: sessionv1.RuleAction_RULE_ACTION_ALLOW})
			}
			return rs
		}()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := &sessionv1.SessionHeader{Id: "s", Options: &sessionv1.SessionOptions{ApprovalRules: bc.rules}}
			log, err := session.NewLog(h, nil)
			if err != nil {
				b.Fatal(err)
			}
			g := NewGate(&Config{Rules: []*sessionv1.ApprovalRule{{Tool: "bash", Action: sessionv1.RuleAction_RULE_ACTION_ASK},
				{Tool: "write", Action: sessionv1.RuleAction_RULE_ACTION_ASK}}}, log, nil)
			ex := &toolsv1.ToolExecution{Name: "bash", CallId: "c", Arguments: `{"command":"docker ps -a"}`, Context: &toolsv1.ToolContext{Cwd: "/work"}}
			if bc.rules == nil {
				ex.Name, ex.Arguments = "read", `{"file_path":"a.go"}`
			}
			b.ReportAllocs()
			for b.Loop() {
				if ok, why := g.Approve(b.Context(), ex, nil, PathKeyUnknown, nil); !ok {
					b.Fatal(why)
				}
			}
		})
	}
}
