package agent

import (
	"context"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

// toolsOf adapts a toolpipe pipeline to the loop's Tools seam.
func toolsOf(p *toolpipe.Pipeline) loop.Tools { return pipeTools{p} }

type pipeTools struct{ p *toolpipe.Pipeline }

func (t pipeTools) Schemas(hosts []string) []*llmv1.ToolSchema { return t.p.Schemas(hosts) }

func (t pipeTools) PrepareCalls(ctx context.Context, hosts []string, execs []*toolsv1.ToolExecution) []*toolsv1.PreparedCall {
	return t.p.PrepareCalls(ctx, hosts, execs)
}

func (t pipeTools) Begin(ctx context.Context, hosts []string, ex *toolsv1.ToolExecution) loop.ToolCall {
	return t.p.Begin(ctx, hosts, ex)
}

func (t pipeTools) Release(execs []*toolsv1.ToolExecution) { t.p.Release(execs) }

// EndSession tells the toolhosts a session left the agent.
func (t pipeTools) EndSession(ctx context.Context, sessionID string) { t.p.EndSession(ctx, sessionID) }
