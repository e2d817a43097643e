package toolhostconformance_test

import (
	"context"
	"net"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
)

type args struct {
	Q string `json:"q" jsonschema:"required"`
}

func TestSDKHostConforms(t *testing.T) {
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, toolsdk.Define("find", "Find.", func(context.Context, *toolsdk.Call, args) (toolsdk.Result, error) {
		return toolsdk.Text("found"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h.Serve(t.Context(), lis)
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	toolhostconformance.Run(t, toolsv1.NewToolHostClient(conn), t.TempDir())
}
