package testpki_test

import (
	"crypto/x509"
	"testing"

	"github.com/dsh-dev/dsh/internal/testpki"
)

// TestLeavesChainToTheirCA: a leaf verifies against its CA with its usage
// and names, and not against another CA or for the other usage.
func TestLeavesChainToTheirCA(t *testing.T) {
	ca, other := testpki.NewCA(t, "a"), testpki.NewCA(t, "b")
	srv := ca.Server("srv", testpki.Loopback())
	cli := ca.Client("cli", testpki.Names{URIs: []string{"spiffe://dsh/agent"}})
	parse := func(l *testpki.Leaf) *x509.Certificate {
		c, err := x509.ParseCertificate(l.TLS.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	s, c := parse(srv), parse(cli)
	if _, err := s.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "localhost"}); err != nil {
		t.Fatalf("server leaf: %v", err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client leaf: %v", err)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://dsh/agent" {
		t.Fatalf("client URIs %v", c.URIs)
	}
	if _, err := s.Verify(x509.VerifyOptions{Roots: other.Pool(), DNSName: "localhost"}); err == nil {
		t.Fatal("a leaf verified against another CA")
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("a client leaf verified for server auth")
	}
}
