// Package testpki makes real X.509 certificates for tests: a CA generated in
// the test, server and client leaves with DNS, IP and URI (SPIFFE) SANs, and
// their PEM files on disk, so TLS and mTLS are tested the way a deployment
// runs them (cert-manager issues the same shapes).
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority living in a test's temporary directory.
type CA struct {
	t       testing.TB
	dir     string
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	serial  int64
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{t: t, dir: t.TempDir(), cert: cert, key: key, serial: 1}
	ca.CertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	ca.CertFile = ca.write(name+"-ca.pem", ca.CertPEM)
	return ca
}

// Pool is a cert pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server issues a server certificate (ExtKeyUsage serverAuth) with names;
// file names start with name.
func (ca *CA) Server(name string, n Names) *Leaf {
	return ca.issue(name, n, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate (ExtKeyUsage clientAuth).
func (ca *CA) Client(name string, n Names) *Leaf {
	return ca.issue(name, n, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(name string, n Names, usage x509.ExtKeyUsage) *Leaf {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: n.CommonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     n.DNS,
		IPAddresses:  n.IPs,
	}
	for _, u := range n.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	l.CertFile = ca.write(name+".pem", l.CertPEM)
	l.KeyFile = ca.write(name+"-key.pem", l.KeyPEM)
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return l
}

func (ca *CA) write(name string, b []byte) string {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}
