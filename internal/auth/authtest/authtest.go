// Package authtest makes real test credentials: a certificate authority that
// issues server and client certificates as PEM files, and JWT issuers whose
// keys are served as a JWKS. Everything is generated per test; nothing is
// checked in.
package authtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

// CA is a test certificate authority.
type CA struct {
	Cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	dir    string
	CAFile string // PEM of the CA certificate
	serial int64
}

// NewCA creates a CA and writes its certificate to dir/<name>-ca.pem.
func NewCA(tb testing.TB, dir, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name + " test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{Cert: cert, key: key, dir: dir, CAFile: filepath.Join(dir, name+"-ca.pem"), serial: 1}
	writePEM(tb, ca.CAFile, "CERTIFICATE", der)
	return ca
}

// Identity is what a certificate says about its holder.
type Identity struct {
	// CommonName defaults to the first DNS name or URI.
	CommonName string
	DNS        []string
	URIs       []string
	IPs        []net.IP
	// Server and Client choose the extended key usages; neither means both.
	Server, Client bool
}

// Pair names a certificate's PEM files.
type Pair struct{ Cert, Key string }

// Issue issues a certificate for id and writes it to dir/<name>.pem and
// dir/<name>-key.pem.
func (ca *CA) Issue(tb testing.TB, name string, id Identity) Pair {
	tb.Helper()
	p := Pair{Cert: filepath.Join(ca.dir, name+".pem"), Key: filepath.Join(ca.dir, name+"-key.pem")}
	ca.IssueTo(tb, p, id)
	return p
}

// IssueTo issues a certificate for id into the files of p, replacing them
// (a rotation: the new files are written beside and renamed into place, as
// cert-manager's atomic writer does).
func (ca *CA) IssueTo(tb testing.TB, p Pair, id Identity) *x509.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: id.CommonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(12 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     id.DNS,
		IPAddresses:  id.IPs,
	}
	for _, u := range id.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			tb.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	if !id.Server && !id.Client {
		id.Server, id.Client = true, true
	}
	if id.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if id.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, p.Key, "PRIVATE KEY", kder)
	writePEM(tb, p.Cert, "CERTIFICATE", der)
	cert, _ := x509.ParseCertificate(der)
	return cert
}

// Loopback is the identity of a server on 127.0.0.1 / localhost.
func Loopback(uris ...string) Identity {
	return Identity{CommonName: "localhost", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: uris}
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}

// Issuer signs JWTs with one asymmetric key.
type Issuer struct {
	Alg    jose.SignatureAlgorithm
	KeyID  string
	Key    crypto.Signer
	signer jose.Signer
}

// NewIssuer makes a key for alg (RS256/PS256: RSA 2048; ES256: P-256;
// EdDSA: Ed25519) with key id kid.
func NewIssuer(tb testing.TB, alg jose.SignatureAlgorithm, kid string) *Issuer {
	tb.Helper()
	var key crypto.Signer
	var err error
	switch alg {
	case jose.RS256, jose.PS256:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.EdDSA:
		_, key, err = ed25519.GenerateKey(rand.Reader)
	default:
		tb.Fatalf("authtest: no key type for %s", alg)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return newIssuerWithKey(tb, alg, kid, key)
}

func newIssuerWithKey(tb testing.TB, alg jose.SignatureAlgorithm, kid string, key crypto.Signer) *Issuer {
	tb.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		tb.Fatal(err)
	}
	return &Issuer{Alg: alg, KeyID: kid, Key: key, signer: s}
}

// JWK is the issuer's public key as a JWK.
func (i *Issuer) JWK() jose.JSONWebKey {
	return jose.JSONWebKey{Key: i.Key.Public(), KeyID: i.KeyID, Algorithm: string(i.Alg), Use: "sig"}
}

// JWKS marshals the public keys of the issuers as a JWKS document.
func JWKS(tb testing.TB, issuers ...*Issuer) []byte {
	tb.Helper()
	set := jose.JSONWebKeySet{}
	for _, i := range issuers {
		set.Keys = append(set.Keys, i.JWK())
	}
	b, err := json.Marshal(set)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Claims are a token's claims: the registered ones plus any extra
// (tenant, roles ...).
type Claims struct {
	jwt.Claims
	Extra map[string]any
}

// Sign returns the compact serialisation of a token with c.
func (i *Issuer) Sign(tb testing.TB, c Claims) string {
	tb.Helper()
	b := jwt.Signed(i.signer).Claims(c.Claims)
	if c.Extra != nil {
		b = b.Claims(c.Extra)
	}
	s, err := b.Serialize()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Valid returns claims valid now for an hour.
func Valid(iss, aud, sub, tenant string, roles ...string) Claims {
	now := time.Now()
	return Claims{
		Claims: jwt.Claims{Issuer: iss, Audience: jwt.Audience{aud}, Subject: sub,
			IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)), Expiry: jwt.NewNumericDate(now.Add(time.Hour))},
		Extra: map[string]any{"tenant": tenant, "roles": roles},
	}
}

// ServerCertificate asks the health service on conn and returns the
// certificate the server presented on that connection.
func ServerCertificate(tb testing.TB, conn grpc.ClientConnInterface) *x509.Certificate {
	tb.Helper()
	var pr peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(tb.Context(), &healthpb.HealthCheckRequest{}, grpc.Peer(&pr)); err != nil {
		tb.Fatal(err)
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		tb.Fatalf("the connection is not TLS: %v", pr.AuthInfo)
	}
	return ti.State.PeerCertificates[0]
}
