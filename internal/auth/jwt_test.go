package auth_test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
)

const (
	testIss = "https://issuer.test"
	testAud = "dsh-agent"
)

// jwksServer serves a JWKS over TLS (httptest's own certificate) and lets a
// test swap the document or fail requests.
type jwksServer struct {
	srv  *httptest.Server
	doc  atomic.Pointer[[]byte]
	down atomic.Bool
	hits atomic.Int64
}

func newJWKSServer(t *testing.T, doc []byte) *jwksServer {
	t.Helper()
	s := &jwksServer{}
	s.doc.Store(&doc)
	s.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if s.down.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*s.doc.Load())
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *jwksServer) set(doc []byte) { s.doc.Store(&doc) }

func newJWT(t *testing.T, js *jwksServer, mutate func(*auth.JWTConfig)) *auth.JWT {
	t.Helper()
	cfg := auth.JWTConfig{JWKS: js.srv.URL + "/jwks.json", Issuer: testIss, Audience: testAud,
		ClockSkew: 30 * time.Second, HTTPClient: js.srv.Client(), MinRefresh: time.Millisecond}
	if mutate != nil {
		mutate(&cfg)
	}
	j, err := auth.NewJWT(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	return j
}

func b64(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// hmacWithPublicKey forges the classic confusion attack: an HS256 token whose
// MAC key is the issuer's public key (PEM), which a verifier that trusts the
// header's alg would accept.
func hmacWithPublicKey(t *testing.T, iss *authtest.Issuer, c authtest.Claims) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(iss.Key.Public())
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	payload := map[string]any{"iss": c.Issuer, "aud": c.Audience, "sub": c.Subject, "exp": c.Expiry}
	for k, v := range c.Extra {
		payload[k] = v
	}
	signing := b64(map[string]string{"alg": "HS256", "typ": "JWT", "kid": iss.KeyID}) + "." + b64(payload)
	m := hmac.New(sha256.New, pemKey)
	m.Write([]byte(signing))
	return signing + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func TestJWTBadInput(t *testing.T) {
	t.Parallel()
	rsaIss := authtest.NewIssuer(t, jose.RS256, "rsa-1")
	ecIss := authtest.NewIssuer(t, jose.ES256, "ec-1")
	stranger := authtest.NewIssuer(t, jose.ES256, "stranger")
	impostor := authtest.NewIssuer(t, jose.ES256, "ec-1") // same kid, other key
	js := newJWKSServer(t, authtest.JWKS(t, rsaIss, ecIss))
	j := newJWT(t, js, nil)

	valid := func() authtest.Claims { return authtest.Valid(testIss, testAud, "alice", "acme", "writer") }
	with := func(f func(*authtest.Claims)) authtest.Claims { c := valid(); f(&c); return c }
	now := time.Now()
	noneTok := b64(map[string]string{"alg": "none", "kid": "ec-1"}) + "." + b64(map[string]any{"iss": testIss, "aud": testAud, "exp": now.Add(time.Hour).Unix(), "tenant": "acme", "roles": []string{"admin"}}) + "."

	cases := []struct {
		name   string
		token  string
		code   codes.Code
		reason string // a part of the message a person acts on
	}{
		{"missing", "", codes.Unauthenticated, "missing credentials"},
		{"not a JWT", "opaque-token-value", codes.Unauthenticated, "three base64url parts"},
		{"header not base64", "%%%.e30.sig", codes.Unauthenticated, "header is not base64url"},
		{"header not JSON", base64.RawURLEncoding.EncodeToString([]byte("nope")) + ".e30.sig", codes.Unauthenticated, "header is not a JSON object"},
		{"bad payload", b64(map[string]string{"alg": "ES256", "kid": "ec-1"}) + ".!!!.sig", codes.Unauthenticated, "malformed token"},
		{"expired", ecIss.Sign(t, with(func(c *authtest.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(-time.Hour)) })), codes.Unauthenticated, "token expired at"},
		{"not yet valid", ecIss.Sign(t, with(func(c *authtest.Claims) { c.NotBefore = jwt.NewNumericDate(now.Add(time.Hour)) })), codes.Unauthenticated, "not valid before"},
		{"issued in the future", ecIss.Sign(t, with(func(c *authtest.Claims) { c.IssuedAt = jwt.NewNumericDate(now.Add(time.Hour)) })), codes.Unauthenticated, "issued in the future"},
		{"no exp", ecIss.Sign(t, with(func(c *authtest.Claims) { c.Expiry = nil })), codes.Unauthenticated, "no exp claim"},
		{"wrong issuer", ecIss.Sign(t, with(func(c *authtest.Claims) { c.Issuer = "https://evil.test" })), codes.Unauthenticated, `issuer "https://evil.test" is not the configured issuer`},
		{"wrong audience", ecIss.Sign(t, with(func(c *authtest.Claims) { c.Audience = jwt.Audience{"other-api"} })), codes.Unauthenticated, `does not include "dsh-agent"`},
		{"alg none", noneTok, codes.Unauthenticated, "unsigned token"},
		{"HMAC with the public key", hmacWithPublicKey(t, rsaIss, valid()), codes.Unauthenticated, "HS256 is not accepted"},
		{"unknown kid", stranger.Sign(t, valid()), codes.Unauthenticated, `key id "stranger" is not in the JWKS`},
		{"signed by another key with a known kid", impostor.Sign(t, valid()), codes.Unauthenticated, "signature does not verify"},
		{"alg does not match the key", hmacKeyConfusion(t, ecIss, rsaIss), codes.Unauthenticated, `key "rsa-1" is for RS256`},
		{"no role", ecIss.Sign(t, with(func(c *authtest.Claims) { c.Extra["roles"] = []string{} })), codes.PermissionDenied, "grants no dsh role"},
		{"only foreign roles", ecIss.Sign(t, with(func(c *authtest.Claims) { c.Extra["roles"] = []string{"billing", "root"} })), codes.PermissionDenied, "grants no dsh role"},
		{"no tenant", ecIss.Sign(t, with(func(c *authtest.Claims) { delete(c.Extra, "tenant") })), codes.PermissionDenied, `no "tenant" claim`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := j.Authenticate(t.Context(), tc.token)
			var ae *auth.Error
			if !asAuthError(err, &ae) {
				t.Fatalf("err = %v, want an *auth.Error", err)
			}
			if ae.Code != tc.code || !strings.Contains(ae.Reason, tc.reason) {
				t.Fatalf("got %s %q, want %s containing %q", ae.Code, ae.Reason, tc.code, tc.reason)
			}
			if tc.token != "" && strings.Contains(ae.Reason, tc.token) {
				t.Fatalf("the reason quotes the token: %q", ae.Reason)
			}
		})
	}

	good := []struct {
		name  string
		token string
		want  auth.Principal
	}{
		{"ES256", ecIss.Sign(t, valid()), auth.Principal{Tenant: "acme", Subject: "alice", Roles: []auth.Role{auth.RoleWriter}}},
		{"RS256 with roles as a string", rsaIss.Sign(t, with(func(c *authtest.Claims) { c.Extra["roles"] = "reader billing,admin" })),
			auth.Principal{Tenant: "acme", Subject: "alice", Roles: []auth.Role{auth.RoleReader, auth.RoleAdmin}}},
		{"audience list and skew-tolerated expiry", ecIss.Sign(t, with(func(c *authtest.Claims) {
			c.Audience = jwt.Audience{"x", testAud}
			c.Expiry = jwt.NewNumericDate(now.Add(-10 * time.Second))
		})), auth.Principal{Tenant: "acme", Subject: "alice", Roles: []auth.Role{auth.RoleWriter}}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			p, err := j.Authenticate(t.Context(), tc.token)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, p); diff != "" {
				t.Fatalf("principal (-want +got):\n%s", diff)
			}
		})
	}
}

// hmacKeyConfusion signs an ES256 token naming the RSA key's kid: the key's
// declared alg must win over the token's.
func hmacKeyConfusion(t *testing.T, signer, victim *authtest.Issuer) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: signer.Alg, Key: jose.JSONWebKey{Key: signer.Key, KeyID: victim.KeyID}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(authtest.Valid(testIss, testAud, "alice", "acme", "writer").Claims).
		Claims(map[string]any{"tenant": "acme", "roles": []string{"writer"}}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func asAuthError(err error, target **auth.Error) bool {
	ae, ok := err.(*auth.Error)
	if ok {
		*target = ae
	}
	return ok
}

// A JWKS URL that is down at start: the agent starts, answers
// UNAUTHENTICATED naming the cause, and serves once the keys load.
func TestJWTKeysDownAtStart(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t, jose.EdDSA, "ed-1")
	js := newJWKSServer(t, authtest.JWKS(t, iss))
	js.down.Store(true)
	j := newJWT(t, js, nil)
	tok := iss.Sign(t, authtest.Valid(testIss, testAud, "bob", "acme", "reader"))
	_, err := j.Authenticate(t.Context(), tok)
	var ae *auth.Error
	if !asAuthError(err, &ae) || ae.Code != codes.Unauthenticated || !strings.Contains(ae.Reason, "no signing keys yet") || !strings.Contains(ae.Reason, "503") {
		t.Fatalf("err = %v, want UNAUTHENTICATED naming the JWKS failure", err)
	}
	js.down.Store(false)
	waitFor(t, func() bool { _, err := j.Authenticate(t.Context(), tok); return err == nil })
}

// A key rotated at the issuer: a token with the new kid triggers a refresh
// and is accepted once the new key set is fetched.
func TestJWTKeyRotation(t *testing.T) {
	t.Parallel()
	old := authtest.NewIssuer(t, jose.ES256, "2026-01")
	js := newJWKSServer(t, authtest.JWKS(t, old))
	j := newJWT(t, js, func(c *auth.JWTConfig) { c.Refresh = time.Hour })
	next := authtest.NewIssuer(t, jose.ES256, "2026-02")
	js.set(authtest.JWKS(t, old, next))
	tok := next.Sign(t, authtest.Valid(testIss, testAud, "bob", "acme", "reader"))
	waitFor(t, func() bool { _, err := j.Authenticate(t.Context(), tok); return err == nil })
}

func TestJWTConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	weakSet, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &weak.PublicKey, KeyID: "weak", Algorithm: "RS256"}}})
	weakFile := filepath.Join(dir, "weak.json")
	if err := os.WriteFile(weakFile, weakSet, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, jwks, want string
	}{
		{"only a 1024-bit RSA key", weakFile, "2048 bits"},
		{"none", "", "needs --jwt-jwks"},
		{"plain http", "http://issuer.test/jwks", "must come over https"},
		{"missing file", filepath.Join(dir, "nope.json"), "no such file"},
		{"only a symmetric key", bad, "symmetric keys are refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.NewJWT(t.Context(), auth.JWTConfig{JWKS: tc.jwks})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// A JWKS file is read at start and verifies tokens.
func TestJWTFromFile(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t, jose.PS256, "ps")
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, authtest.JWKS(t, iss), 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := auth.NewJWT(t.Context(), auth.JWTConfig{JWKS: path, Issuer: testIss, Audience: testAud})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, err := j.Authenticate(context.Background(), iss.Sign(t, authtest.Valid(testIss, testAud, "c", "t", "admin"))); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The verified-token cache never outlives the token or the key set: an
// expired token is refused although it verified before, and a token whose
// key left the JWKS is refused once the set reloads.
func TestJWTCacheBounds(t *testing.T) {
	t.Parallel()
	iss := authtest.NewIssuer(t, jose.ES256, "k-old")
	js := newJWKSServer(t, authtest.JWKS(t, iss))
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	j := newJWT(t, js, func(c *auth.JWTConfig) {
		c.Refresh = 10 * time.Millisecond
		c.Now = func() time.Time { return time.Unix(0, now.Load()) }
	})
	c := authtest.Valid(testIss, testAud, "alice", "acme", "writer")
	c.Expiry = jwt.NewNumericDate(time.Unix(0, now.Load()).Add(time.Minute))
	tok := iss.Sign(t, c)
	for range 2 { // verified, then cached
		if _, err := j.Authenticate(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
	}
	now.Add(int64(2 * time.Minute)) // past exp + 30 s skew
	if _, err := j.Authenticate(t.Context(), tok); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired cached token: %v", err)
	}
	now.Store(time.Now().UnixNano())
	if _, err := j.Authenticate(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	js.set(authtest.JWKS(t, authtest.NewIssuer(t, jose.ES256, "k-new")))
	waitFor(t, func() bool {
		_, err := j.Authenticate(t.Context(), tok)
		return err != nil && strings.Contains(err.Error(), `"k-old" is not in the JWKS`)
	})
}
