package auth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/auth/authtest"
)

// FuzzParseTokens: any token file either fails naming its line or yields at
// most one token per hash field, without panicking.
func FuzzParseTokens(f *testing.F) {
	f.Add(hashLine("t", "acme alice reader,writer"))
	f.Add("# c\n\n" + hashLine("t", "acme alice admin") + "\n" + hashLine("u", "b bob reader"))
	f.Add("sha256:zz a b c")
	f.Fuzz(func(t *testing.T, file string) {
		toks, err := auth.ParseTokens(strings.NewReader(file))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "line ") {
				t.Fatalf("error does not name a line: %v", err)
			}
			return
		}
		if toks.Len() > strings.Count(file, "sha256:") {
			t.Fatalf("%d tokens from %d hash fields", toks.Len(), strings.Count(file, "sha256:"))
		}
	})
}

// FuzzJWT: no input authenticates without a signature by the issuer's key,
// and none panics.
func FuzzJWT(f *testing.F) {
	iss := authtest.NewIssuer(f, jose.ES256, "k1")
	path := filepath.Join(f.TempDir(), "jwks.json")
	if err := os.WriteFile(path, authtest.JWKS(f, iss), 0o600); err != nil {
		f.Fatal(err)
	}
	j, err := auth.NewJWT(f.Context(), auth.JWTConfig{JWKS: path, Issuer: testIss, Audience: testAud, CacheSize: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(j.Close)
	valid := iss.Sign(f, authtest.Valid(testIss, testAud, "alice", "acme", "writer"))
	// A signature with one byte in its middle changed.
	mid := strings.LastIndexByte(valid, '.') + 20
	flip := byte('A')
	if valid[mid] == 'A' {
		flip = 'B'
	}
	f.Add(valid[:mid] + string(flip) + valid[mid+1:])
	f.Add(strings.Replace(valid, ".", "..", 1))
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, tok string) {
		if tok == valid {
			return
		}
		if p, err := j.Authenticate(t.Context(), tok); err == nil {
			t.Fatalf("forged token %q authenticated as %+v", tok, p)
		}
	})
}
