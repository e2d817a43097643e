package auth

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Peers admits only callers whose verified client certificate carries one
// of the allowed identities (--allow-peer): a URI SAN such as
// spiffe://dsh/agent, or a DNS SAN. Everything else is PERMISSION_DENIED,
// except the health service (OpenMethod).
type Peers struct {
	uris, dns map[string]bool
	denier
}

// NewPeers returns the peer check for the allowed identities; an identity
// containing "://" is a URI SAN, anything else a DNS SAN.
func NewPeers(allowed []string, log *slog.Logger, denials DenialCounter) (*Peers, error) {
	p := &Peers{uris: map[string]bool{}, dns: map[string]bool{}, denier: newDenier(log, denials)}
	for _, a := range allowed {
		switch {
		case strings.TrimSpace(a) == "":
			return nil, fmt.Errorf("--allow-peer: empty identity")
		case strings.Contains(a, "://"):
			p.uris[a] = true
		default:
			p.dns[strings.ToLower(a)] = true
		}
	}
	return p, nil
}

// ServerOptions installs the peer check.
func (p *Peers) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(p.Unary), grpc.ChainStreamInterceptor(p.Stream)}
}

// Identity returns the allowed identity of the caller of ctx, or an error
// saying why there is none.
func (p *Peers) Identity(ctx context.Context) (string, error) {
	leaf := peerLeaf(ctx)
	if leaf == nil {
		return "", denied("the caller presented no verified client certificate; this server admits only %s", p.allowedList())
	}
	for _, u := range leaf.URIs {
		if s := u.String(); p.uris[s] {
			return s, nil
		}
	}
	for _, d := range leaf.DNSNames {
		if p.dns[strings.ToLower(d)] {
			return d, nil
		}
	}
	return "", denied("client certificate %s is not allowed here; this server admits only %s", certIdentity(leaf), p.allowedList())
}

func (p *Peers) check(ctx context.Context, method string) error {
	if OpenMethod(method) {
		return nil
	}
	if _, err := p.Identity(ctx); err != nil {
		return p.deny(ctx, nil, Target{FullMethod: method}, err)
	}
	return nil
}

// Unary is the unary server interceptor.
func (p *Peers) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := p.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// Stream is the stream server interceptor.
func (p *Peers) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := p.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

func (p *Peers) allowedList() string {
	var out []string
	for u := range p.uris {
		out = append(out, u)
	}
	for d := range p.dns {
		out = append(out, "DNS:"+d)
	}
	return strings.Join(out, ", ")
}

func peerLeaf(ctx context.Context) *x509.Certificate {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

// certIdentity describes a certificate for messages: its SANs, or its
// subject when it has none.
func certIdentity(c *x509.Certificate) string {
	var ids []string
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	for _, d := range c.DNSNames {
		ids = append(ids, "DNS:"+d)
	}
	if len(ids) == 0 {
		return "subject " + c.Subject.String()
	}
	return "(" + strings.Join(ids, ", ") + ")"
}
