package auth

import (
	"context"

	"google.golang.org/grpc/credentials"
)

// Bearer returns per-RPC credentials sending `authorization: Bearer token`.
// With requireTLS gRPC refuses to send it over a plaintext connection; pass
// false only for a loopback address.
func Bearer(token string, requireTLS bool) credentials.PerRPCCredentials {
	return bearer{md: map[string]string{"authorization": "Bearer " + token}, tls: requireTLS}
}

type bearer struct {
	md  map[string]string
	tls bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return b.md, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.tls }
