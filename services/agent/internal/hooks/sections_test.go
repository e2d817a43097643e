package hooks_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

// sectionsHook answers agent/prompt-sections: it replaces a section named in
// the request and adds its own; with fail set it errors.
type sectionsHook struct {
	agentv1.UnimplementedAgentHooksServer
	fail bool
	got  *agentv1.PromptSectionsRequest
}

func (h *sectionsHook) PromptSections(_ context.Context, req *agentv1.PromptSectionsRequest) (*agentv1.PromptSectionsResponse, error) {
	h.got = req
	if h.fail {
		return nil, status.Error(codes.Unavailable, "policy store down")
	}
	return &agentv1.PromptSectionsResponse{Sections: []*agentv1.PromptSection{
		{Name: "local", Order: 5, Text: "Replaced by the remote."},
		{Name: "tenant:rules", Order: 150, Text: "Tenant rules for {{cwd}}."},
	}}, nil
}

func remoteSet(t *testing.T, h *sectionsHook, failOpen bool) *hooks.Set {
	t.Helper()
	addr := fakes.Serve(t, func(s *grpc.Server) { agentv1.RegisterAgentHooksServer(s, h) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var set hooks.Set
	(&hooks.Remote{Name: "sections", Client: agentv1.NewAgentHooksClient(conn), Timeout: 5 * time.Second, FailOpen: failOpen}).Install(&set)
	// A later (inner) link: the remote sees its section as current.
	set.PromptSections.Use(func(ctx context.Context, in *hooks.PromptSections, next hooks.Next[*hooks.PromptSections, []prompt.Section]) ([]prompt.Section, error) {
		cur, err := next(ctx, in)
		return append(cur, prompt.Section{Name: "local", Order: 1, Text: "local"}), err
	})
	return &set
}

func runSections(set *hooks.Set) ([]prompt.Section, error) {
	return set.PromptSections.Run(context.Background(), &hooks.PromptSections{Subject: hooks.Subject{SessionID: "s", Cwd: "/w"}, Turn: 3},
		func(context.Context, *hooks.PromptSections) ([]prompt.Section, error) { return nil, nil })
}

func TestRemotePromptSections(t *testing.T) {
	t.Parallel()
	h := &sectionsHook{}
	got, err := runSections(remoteSet(t, h, false))
	if err != nil {
		t.Fatal(err)
	}
	want := []prompt.Section{{Name: "local", Order: 5, Text: "Replaced by the remote."}, {Name: "tenant:rules", Order: 150, Text: "Tenant rules for {{cwd}}."}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("sections %v, want %v", got, want)
	}
	if h.got.GetSessionId() != "s" || h.got.GetCwd() != "/w" || h.got.GetTurn() != 3 || len(h.got.GetCurrent()) != 1 {
		t.Errorf("request %v", h.got)
	}

	// Fail closed: the turn fails naming the hook; fail open: the earlier
	// links' sections stand.
	if _, err := runSections(remoteSet(t, &sectionsHook{fail: true}, false)); err == nil || !strings.Contains(err.Error(), "remote hook sections prompt-sections") {
		t.Errorf("fail closed: %v", err)
	}
	got, err = runSections(remoteSet(t, &sectionsHook{fail: true}, true))
	if err != nil || len(got) != 1 || got[0].Text != "local" {
		t.Errorf("fail open: %v, %v", got, err)
	}
}
