package prompt

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// WorkspaceClient is the part of a toolhost client a workspace read needs.
type WorkspaceClient interface {
	GetWorkspaceContext(ctx context.Context, in *toolsv1.GetWorkspaceContextRequest, opts ...grpc.CallOption) (*toolsv1.GetWorkspaceContextResponse, error)
}

// Host is one toolhost that may own a workspace.
type Host struct {
	Name   string
	Client WorkspaceClient
}

// Workspaces reads a session's workspace context from its visible
// toolhosts. A host that owns no workspace (or predates the RPC) adds
// nothing; a host that fails adds a notice and is retried next time, so a
// broken host never fails a turn. Concurrent reads of one host and cwd
// share calls (see reads); a Workspaces must not be copied after first use.
//
// Every read names the session's workspace root (options.workspace_root;
// empty: each host's own root), so a host reads the context within it: a
// session of ws/a gets nothing of ws/b or ws on a host rooted at ws. A host
// that predates GetWorkspaceContextRequest.workspace_root ignores it and
// answers within its own root, as before.
type Workspaces struct {
	Hosts []Host
	// Timeout bounds each host's answer; zero means 10 s.
	Timeout time.Duration
	Logger  *slog.Logger

	reads reads
}

// Context merges the visible hosts' contexts (hosts empty = all), in host
// order: instruction files concatenated (also those of hosts that own no
// workspace, such as the MCP bridge's server instructions), skills by name with the first
// host winning, notices prefixed with the host's name. The version joins
// the hosts' versions, so it changes when any of them does. root is the
// session's workspace root (empty: each host's own).
func (w *Workspaces) Context(ctx context.Context, cwd, root string, hosts []string) (*toolsv1.GetWorkspaceContextResponse, error) {
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	// Every visible host's read starts now; the answers merge in host order.
	type hostRead struct {
		h  Host
		sh share
	}
	var asks []hostRead
	for _, h := range w.Hosts {
		if len(hosts) == 0 || slices.Contains(hosts, h.Name) {
			asks = append(asks, hostRead{h, w.reads.join(ctx, h, readKey{h.Name, cwd, root}, timeout)})
		}
	}
	out := &toolsv1.GetWorkspaceContextResponse{}
	var versions []string
	taken := map[string]bool{}
	for _, r := range asks {
		h := r.h
		resp, err := r.sh.wait(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch {
		case status.Code(err) == codes.Unimplemented:
			continue
		case err != nil:
			if w.Logger != nil {
				// A cwd outside the host's workspace is a standing fact of the
				// session, not news every turn.
				level := slog.LevelWarn
				if status.Code(err) == codes.InvalidArgument {
					level = slog.LevelDebug
				}
				w.Logger.Log(ctx, level, "workspace context unavailable", "toolhost", h.Name, "cwd", cwd, "err", err)
			}
			out.Notices = append(out.Notices, &toolsv1.WorkspaceNotice{Message: fmt.Sprintf("toolhost %s: workspace context unavailable: %v", h.Name, status.Convert(err).Message())})
			versions = append(versions, h.Name+":error")
			continue
		case !resp.GetOwnsWorkspace():
			// A host without a workspace may still bring instructions (the
			// MCP bridge: its servers' initialize instructions); nothing else
			// of its answer is used.
			if len(resp.GetInstructions()) > 0 {
				out.Instructions = append(out.Instructions, resp.GetInstructions()...)
				versions = append(versions, h.Name+":"+resp.GetVersion())
			}
			continue
		}
		out.OwnsWorkspace = true
		if out.ProjectRoot == "" {
			out.ProjectRoot = resp.GetProjectRoot()
		}
		out.Instructions = append(out.Instructions, resp.GetInstructions()...)
		for _, s := range resp.GetSkills() {
			if taken[s.GetName()] {
				out.SkillErrors = append(out.SkillErrors, &toolsv1.WorkspaceNotice{Path: s.GetPath(),
					Message: fmt.Sprintf("toolhost %s: skill %q not offered: another toolhost lists it first", h.Name, s.GetName())})
				continue
			}
			taken[s.GetName()] = true
			out.Skills = append(out.Skills, s)
		}
		for _, n := range resp.GetNotices() {
			out.Notices = append(out.Notices, &toolsv1.WorkspaceNotice{Path: n.GetPath(), Message: "toolhost " + h.Name + ": " + n.GetMessage()})
		}
		for _, n := range resp.GetSkillErrors() {
			out.SkillErrors = append(out.SkillErrors, &toolsv1.WorkspaceNotice{Path: n.GetPath(), Message: "toolhost " + h.Name + ": " + n.GetMessage()})
		}
		versions = append(versions, h.Name+":"+resp.GetVersion())
	}
	slices.SortStableFunc(out.Skills, func(a, b *toolsv1.SkillSummary) int { return strings.Compare(a.GetName(), b.GetName()) })
	out.Version = strings.Join(versions, ",")
	return out, nil
}

// CheckCwd asks the visible hosts (hosts empty = all) whether a session may
// work in cwd within its workspace root (empty: the host's), before the
// session exists: a host that refuses it (INVALID_ARGUMENT: outside its
// workspace or the root, or missing; a root outside its workspace) makes it an error
// naming the host, so a mismatch fails at creation instead of in every tool
// call. A host that does not answer (down, or predating the RPC) is not a
// refusal: the turn's own read reports it as a notice.
func (w *Workspaces) CheckCwd(ctx context.Context, cwd, root string, hosts []string) error {
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	for _, h := range w.Hosts {
		if len(hosts) > 0 && !slices.Contains(hosts, h.Name) {
			continue
		}
		_, err := w.reads.join(ctx, h, readKey{h.Name, cwd, root}, timeout).wait(ctx)
		switch {
		case err == nil, status.Code(err) == codes.Unimplemented:
		case status.Code(err) == codes.InvalidArgument && root != "":
			return fmt.Errorf("toolhost %s refuses cwd %s within options.workspace_root %s: %s", h.Name, cwd, root, status.Convert(err).Message())
		case status.Code(err) == codes.InvalidArgument:
			return fmt.Errorf("toolhost %s refuses cwd %s: %s", h.Name, cwd, status.Convert(err).Message())
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			if w.Logger != nil {
				w.Logger.Warn("could not check a new session's cwd", "toolhost", h.Name, "cwd", cwd, "err", err)
			}
		}
	}
	return nil
}
