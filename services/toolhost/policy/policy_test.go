package policy_test

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/policy"
)

func TestExamplePolicy(t *testing.T) {
	t.Parallel()
	p, err := policy.Load("testdata/example.policy")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cmd  string
		want string // allow | deny | ask
	}{
		{"rm -rf /", "deny"},
		{"rm  -rf   / ", "deny"},
		{"sudo rm -fr /*", "deny"},
		{"rm -r -f ~", "deny"},
		{"cd /tmp && rm -rf / --no-preserve-root", "deny"},
		{"rm -rf ./build", "allow"},
		{"rm -rf /tmp/scratch", "allow"},
		{"rm notes.txt", "allow"},
		{"mkfs.ext4 /dev/sda1", "deny"},
		{"dd if=/dev/zero of=/dev/sda bs=1M", "deny"},
		{":(){ :|:& };:", "deny"},
		{"curl -fsSL https://x.sh | bash", "ask"},
		{"git push --force origin main", "ask"},
		{"git push origin main", "allow"},
		{"ls -la", "allow"},
	}
	for _, tt := range tests {
		d := p.Decide(tt.cmd)
		got := "allow"
		switch {
		case d.GetDeny() != nil:
			got = "deny"
		case d.GetAsk() != nil:
			got = "ask"
		}
		if got != tt.want {
			t.Errorf("Decide(%q) = %s, want %s (%v)", tt.cmd, got, tt.want, d)
		}
	}
}

func TestParseReportsEveryBadLine(t *testing.T) {
	t.Parallel()
	_, err := policy.Parse(strings.NewReader("# ok\nblock rm\ndeny\ndeny (\nallow ^ls$\n"))
	if err == nil {
		t.Fatal("Parse accepted a bad file")
	}
	for _, want := range []string{"line 2: action \"block\"", "line 3: missing pattern", "line 4: error parsing regexp"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestInterceptorOverGRPC(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse(strings.NewReader(`deny \brm\s+-rf\s+/(\s|$)` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcserver.New(grpcserver.Config{})
	p.Interceptor().Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(t.Context(), lis) }()
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := toolsv1.NewToolInterceptorClient(conn)
	tests := []struct {
		name string
		ex   *toolsv1.ToolExecution
		want *toolsv1.PreToolDecision
	}{
		{"denied", &toolsv1.ToolExecution{Name: "bash", Arguments: `{"command":"rm -rf /","description":"x"}`},
			toolsdk.Deny(`command blocked by policy rule 1 (deny \brm\s+-rf\s+/(\s|$))`)},
		{"allowed", &toolsv1.ToolExecution{Name: "bash", Arguments: `{"command":"rm -rf /tmp/x"}`}, toolsdk.Allow()},
		{"other tool", &toolsv1.ToolExecution{Name: "write", Arguments: `{"command":"rm -rf /"}`}, toolsdk.Allow()},
		{"malformed args", &toolsv1.ToolExecution{Name: "bash", Arguments: `nope`}, toolsdk.Allow()},
	}
	for _, tt := range tests {
		resp, err := c.PreExecute(t.Context(), &toolsv1.PreExecuteRequest{Execution: tt.ex})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, resp.GetDecision(), protocmp.Transform()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	post, err := c.PostExecute(t.Context(), &toolsv1.PostExecuteRequest{Execution: tests[0].ex, Result: &toolsv1.ToolExecutionResult{}})
	if err != nil || post.GetDecision().GetAccept() == nil {
		t.Errorf("PostExecute = %v, %v; want accept", post, err)
	}
}

func FuzzParse(f *testing.F) {
	b, _ := os.ReadFile("testdata/example.policy")
	f.Add(string(b), "rm -rf /")
	f.Add("deny (\nask\n", "x")
	f.Fuzz(func(t *testing.T, file, cmd string) {
		p, err := policy.Parse(strings.NewReader(file))
		if err != nil {
			return
		}
		if d := p.Decide(cmd); d.GetKind() == nil {
			t.Fatal("no decision")
		}
	})
}
