package toolsdk

import (
	"context"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// GetWorkspaceContext answers with HostConfig.WorkspaceContextWithin, else
// HostConfig.WorkspaceContext, or with an empty context (owns_workspace
// false) when the host owns no workspace. A
// missing or relative cwd, or a relative workspace_root, is
// INVALID_ARGUMENT either way.
func (h *Host) GetWorkspaceContext(ctx context.Context, req *toolsv1.GetWorkspaceContextRequest) (*toolsv1.GetWorkspaceContextResponse, error) {
	cwd, root := req.GetCwd(), req.GetWorkspaceRoot()
	if cwd == "" || !filepath.IsAbs(cwd) {
		return nil, status.Errorf(codes.InvalidArgument, "cwd %q must be an absolute path", cwd)
	}
	if root != "" && !filepath.IsAbs(root) {
		return nil, status.Errorf(codes.InvalidArgument, "workspace_root %q must be an absolute path (or empty for the host's root)", root)
	} else if root != "" {
		root = filepath.Clean(root)
	}
	var (
		resp *toolsv1.GetWorkspaceContextResponse
		err  error
	)
	switch cwd = filepath.Clean(cwd); {
	case h.cfg.WorkspaceContextWithin != nil:
		resp, err = h.cfg.WorkspaceContextWithin(ctx, cwd, root)
	case h.cfg.WorkspaceContext != nil:
		resp, err = h.cfg.WorkspaceContext(ctx, cwd)
	default:
		return &toolsv1.GetWorkspaceContextResponse{}, nil
	}
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		h.log.Error("workspace context failed", "cwd", cwd, "err", err)
		return nil, status.Error(codes.Internal, "workspace context: internal error")
	}
	return resp, nil
}
