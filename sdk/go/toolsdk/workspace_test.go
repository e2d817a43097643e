package toolsdk_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

func TestGetWorkspaceContext(t *testing.T) {
	t.Parallel()
	plain, err := toolsdk.NewHost(toolsdk.HostConfig{})
	if err != nil {
		t.Fatal(err)
	}
	owning, err := toolsdk.NewHost(toolsdk.HostConfig{WorkspaceContextWithin: func(_ context.Context, cwd, root string) (*toolsv1.GetWorkspaceContextResponse, error) {
		switch cwd {
		case "/ws":
			// The version echoes the session root the hook was given.
			return &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, ProjectRoot: cwd, Version: root}, nil
		case "/outside":
			return nil, status.Error(codes.InvalidArgument, "outside")
		}
		return nil, errors.New("disk on fire")
	}})
	if err != nil {
		t.Fatal(err)
	}
	// A host written before workspace_root (the cwd-only hook) still
	// answers, as a host that predates the field: within its own root.
	older, err := toolsdk.NewHost(toolsdk.HostConfig{WorkspaceContext: func(_ context.Context, cwd string) (*toolsv1.GetWorkspaceContextResponse, error) {
		return &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, ProjectRoot: cwd}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	// Both hooks: the root-aware one answers.
	both, err := toolsdk.NewHost(toolsdk.HostConfig{
		WorkspaceContext: func(_ context.Context, cwd string) (*toolsv1.GetWorkspaceContextResponse, error) {
			return &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, ProjectRoot: "/the-cwd-only-hook"}, nil
		},
		WorkspaceContextWithin: func(_ context.Context, cwd, root string) (*toolsv1.GetWorkspaceContextResponse, error) {
			return &toolsv1.GetWorkspaceContextResponse{OwnsWorkspace: true, ProjectRoot: cwd, Version: root}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		h    *toolsdk.Host
		cwd  string
		wr   string // the request's workspace_root
		root string
		seen string // the workspace root the hook saw
		code codes.Code
	}{
		{"no workspace answers empty", plain, "/anything", "", "", "", codes.OK},
		{"relative cwd", plain, "rel", "", "", "", codes.InvalidArgument},
		{"empty cwd", owning, "", "", "", "", codes.InvalidArgument},
		{"hook answers (cwd cleaned)", owning, "/ws/./", "", "/ws", "", codes.OK},
		{"hook gets the session root, cleaned", owning, "/ws", "/ws/./", "/ws", "/ws", codes.OK},
		{"relative workspace_root", owning, "/ws", "ws", "", "", codes.InvalidArgument},
		{"relative workspace_root, no workspace", plain, "/ws", "ws", "", "", codes.InvalidArgument},
		{"hook status passes through", owning, "/outside", "", "", "", codes.InvalidArgument},
		{"other errors are internal", owning, "/boom", "", "", "", codes.Internal},
		{"a cwd-only hook answers, root or not", older, "/ws/./", "/ws", "/ws", "", codes.OK},
		{"with both hooks the root-aware one answers", both, "/ws", "/ws/a", "/ws", "/ws/a", codes.OK},
		{"a cwd-only hook: relative workspace_root", older, "/ws", "ws", "", "", codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := tt.h.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: tt.cwd, WorkspaceRoot: tt.wr})
			if status.Code(err) != tt.code {
				t.Fatalf("err %v, want %v", err, tt.code)
			}
			if err == nil && resp.GetProjectRoot() != tt.root {
				t.Errorf("project root %q, want %q", resp.GetProjectRoot(), tt.root)
			}
			if err == nil && resp.GetVersion() != tt.seen {
				t.Errorf("the hook saw workspace root %q, want %q", resp.GetVersion(), tt.seen)
			}
		})
	}
}
