package grpcserver

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// credsOption marks a dial option carrying the caller's own transport
// credentials (see WithCredentials).
type credsOption struct{ grpc.DialOption }

// WithCredentials wraps a transport-credentials dial option so Dial does not
// add insecure credentials of its own.
func WithCredentials(o grpc.DialOption) grpc.DialOption { return credsOption{o} }

func hasCreds(opts []grpc.DialOption) bool {
	for _, o := range opts {
		if _, ok := o.(credsOption); ok {
			return true
		}
	}
	return false
}

func insecureCreds() grpc.DialOption { return grpc.WithTransportCredentials(insecure.NewCredentials()) }
