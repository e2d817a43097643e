package toolsdk_test

import (
	"context"
	"testing"

	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// BenchmarkExecuteRoundTrip is one Execute of a trivial typed tool over
// loopback gRPC: request, validation, body, presenter, result, stream close.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	noop := toolsdk.Define("noop", "Does nothing.", func(context.Context, *toolsdk.Call, echoArgs) (toolsdk.Result, error) {
		return toolsdk.Text("ok"), nil
	})
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, noop)
	if err != nil {
		b.Fatal(err)
	}
	c := startHost(b, h)
	req := exec("noop", `{"text":"hi"}`)
	ctx := context.Background()
	if _, _, err := collect(ctx, b, c, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_, res, err := collect(ctx, b, c, req)
		if err != nil || res.GetIsError() {
			b.Fatalf("err %v res %v", err, res)
		}
	}
}
