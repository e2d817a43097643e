// Package testpki is the file-and-bytes view of the test PKI for tests that
// configure TLS from PEM bytes or tls.Certificate values (NATS, Python and
// Node hosts): a CA generated in the test, server and client leaves with DNS,
// IP and URI (SPIFFE) SANs, and their PEM files on disk. The certificates
// themselves are made by internal/auth/authtest, the one issuer of test
// certificates.
package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"

	"github.com/dsh-dev/dsh/internal/auth/authtest"
)

// CA is a certificate authority living in a test's temporary directory.
type CA struct {
	t       testing.TB
	ca      *authtest.CA
	CertPEM []byte
	// CertFile is the CA certificate's PEM file (what --tls-ca and
	// --tls-client-ca take).
	CertFile string
}

// Leaf is an issued certificate and its key.
type Leaf struct {
	CertPEM, KeyPEM []byte
	// CertFile and KeyFile are the PEM files.
	CertFile, KeyFile string
	// TLS is the pair ready for a tls.Config.
	TLS tls.Certificate
}

// Names are the subject alternative names of a leaf.
type Names struct {
	// DNS names; "localhost" for a loopback server.
	DNS []string
	// IPs; 127.0.0.1 for a loopback server.
	IPs []net.IP
	// URIs such as spiffe://dsh/agent.
	URIs []string
	// CommonName is informational only.
	CommonName string
}

// Loopback are the names of a server on 127.0.0.1 or localhost.
func Loopback() Names {
	return Names{DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, CommonName: "localhost"}
}

// NewCA makes a CA named name whose files live in t.TempDir().
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca := &CA{t: t, ca: authtest.NewCA(t, t.TempDir(), name)}
	ca.CertFile = ca.ca.CAFile
	ca.CertPEM = ca.read(ca.CertFile)
	return ca
}

// Pool is a cert pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.ca.Cert)
	return p
}

// Server issues a server certificate (ExtKeyUsage serverAuth) with names;
// file names start with name.
func (ca *CA) Server(name string, n Names) *Leaf {
	return ca.issue(name, n, true)
}

// Client issues a client certificate (ExtKeyUsage clientAuth).
func (ca *CA) Client(name string, n Names) *Leaf {
	return ca.issue(name, n, false)
}

func (ca *CA) issue(name string, n Names, server bool) *Leaf {
	t := ca.t
	t.Helper()
	p := ca.ca.Issue(t, name, authtest.Identity{CommonName: n.CommonName, DNS: n.DNS, URIs: n.URIs, IPs: n.IPs,
		Server: server, Client: !server})
	l := &Leaf{CertPEM: ca.read(p.Cert), KeyPEM: ca.read(p.Key), CertFile: p.Cert, KeyFile: p.Key}
	var err error
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return l
}

func (ca *CA) read(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		ca.t.Fatal(err)
	}
	return b
}
