package main

import (
	"context"
	"fmt"
	"strings"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// compactCommand runs the chat's /compact: a manual compaction of the
// whole eligible context (the events render as the compaction card). It
// reports whether line was the command.
func compactCommand(ctx context.Context, c agentv1.AgentServiceClient, id, line string, scr *screen) bool {
	if line != "/compact" && !strings.HasPrefix(line, "/compact ") {
		return false
	}
	if strings.TrimSpace(strings.TrimPrefix(line, "/compact")) != "" {
		scr.println("usage: /compact (summarizes the older part of the context; dsh also compacts on its own near the window)")
		return true
	}
	resp, err := c.Compact(ctx, &agentv1.CompactRequest{SessionId: id})
	if err != nil {
		scr.println(rpcError("compact", err).Error())
		return true
	}
	msg := fmt.Sprintf("compacted: %d messages (%d tokens) now a summary", len(resp.GetShadowedSeqs()), resp.GetShadowedTokenCount())
	if resp.GetEndSeq() == 0 {
		msg = "compacted: nothing to summarize"
	}
	if n := resp.GetPruned(); n > 0 {
		msg += fmt.Sprintf("; %d long tool outputs pruned", n)
	}
	scr.println(msg + " · context " + gauge(resp.GetContext()))
	scr.setGauge(resp.GetContext())
	return true
}

// gauge is the context meter of the status line: "41% of 4k", or the
// tokens alone when the window is unknown.
func gauge(m *agentv1.ContextMeasurement) string {
	if m == nil {
		return ""
	}
	if m.Ratio == nil {
		return kilo(m.GetTotalTokens()) + " tokens"
	}
	return fmt.Sprintf("%d%% of %s", int(m.GetRatio()*100+0.5), kilo(m.GetContextWindow()))
}

// kilo writes a token count compactly (950, 1.6k, 128k).
func kilo(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprint(n)
	case n < 10_000:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1000), ".0") + "k"
	}
	return fmt.Sprintf("%dk", (n+500)/1000)
}

// setGauge shows m before the next prompt.
func (s *screen) setGauge(m *agentv1.ContextMeasurement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gauge = gauge(m)
}

// refreshGauge reads the session's context measurement (after a turn).
func (s *screen) refreshGauge(ctx context.Context, c agentv1.AgentServiceClient, id string) {
	resp, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		return // the gauge keeps its last reading
	}
	s.setGauge(resp.GetSession().GetContext())
}
