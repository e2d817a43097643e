package toolpipe

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// endSessionTimeout bounds one host's EndSession: the Go toolhost answers
// once the session's background tasks are gone (TERM, KILL after its
// grace, 3 s by default).
const endSessionTimeout = 15 * time.Second

// EndSession tells every remote host that a session left the agent so it
// releases what it holds for it (background tasks die with their session).
// Hosts are told in parallel; a host that does not know the RPC (an older
// host: Unimplemented) holds nothing to release, and any other failure is
// logged: the session is gone either way, and the toolhost's own shutdown
// still kills what is left.
func (p *Pipeline) EndSession(ctx context.Context, sessionID string) {
	var wg sync.WaitGroup
	for _, hs := range p.hosts {
		if hs.host.Local != nil {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, endSessionTimeout)
			defer cancel()
			r, err := hs.host.Client.EndSession(cctx, &toolsv1.EndSessionRequest{SessionId: sessionID})
			switch {
			case status.Code(err) == codes.Unimplemented:
			case err != nil:
				p.log.Warn("toolhost did not end the session; its background tasks may outlive it", "host", hs.host.Name, "session", sessionID, "err", err)
			case r.GetTasksStopped() > 0:
				p.log.Info("session ended: background tasks stopped", "host", hs.host.Name, "session", sessionID, "tasks", r.GetTasksStopped())
			}
		})
	}
	wg.Wait()
}
