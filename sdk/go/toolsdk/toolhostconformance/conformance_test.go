package toolhostconformance_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
)

type args struct {
	Q string `json:"q" jsonschema:"required"`
}

// withoutPrepareExecute is an SDK host that answers PrepareExecute
// UNIMPLEMENTED, as the Python and TypeScript SDK hosts do.
type withoutPrepareExecute struct{ *toolsdk.Host }

func (withoutPrepareExecute) PrepareExecute(grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]) error {
	return status.Error(codes.Unimplemented, "method PrepareExecute not implemented")
}

func TestSDKHostConforms(t *testing.T) {
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, toolsdk.Define("find", "Find.", func(context.Context, *toolsdk.Call, args) (toolsdk.Result, error) {
		return toolsdk.Text("found"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		srv  toolsv1.ToolHostServer
	}{{"with PrepareExecute", h}, {"without PrepareExecute", withoutPrepareExecute{h}}} {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpcserver.New(grpcserver.Config{})
			toolsv1.RegisterToolHostServer(srv, tt.srv)
			done := make(chan error, 1)
			ctx, cancel := context.WithCancel(t.Context())
			go func() { done <- srv.Serve(ctx, lis) }()
			conn, err := grpcserver.Dial(lis.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				conn.Close()
				cancel()
				<-done
			}()
			toolhostconformance.Run(t, toolsv1.NewToolHostClient(conn), t.TempDir())
		})
	}
}
