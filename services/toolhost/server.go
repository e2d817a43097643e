package toolhost

import (
	"context"
	"net"

	"github.com/dsh-dev/dsh/internal/grpcserver"
	"google.golang.org/grpc"
)

// Serve serves the toolhost on lis until ctx ends, with health, reflection
// and OpenTelemetry, plus whatever register adds (the policy interceptor, for
// example). When ctx ends it first ends every WatchTools stream, then drains
// in-flight calls; it does not Close the service.
func (s *Service) Serve(ctx context.Context, lis net.Listener, register ...func(grpc.ServiceRegistrar)) error {
	srv := grpcserver.New(grpcserver.Config{Logger: s.log, Options: s.srvOpts})
	s.Register(srv)
	for _, r := range register {
		r(srv)
	}
	stop := context.AfterFunc(ctx, s.host.StopWatches)
	defer stop()
	return srv.Serve(ctx, lis)
}
