package auth

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/grpc/codes"
)

// Authenticator turns a request's bearer credential into a Principal. bearer
// is the text after "Bearer " in the authorization metadata ("" when the
// request carries none). Errors are *Error values.
type Authenticator interface {
	Authenticate(ctx context.Context, bearer string) (Principal, error)
}

// Error is an authentication or authorization failure: its Code is the gRPC
// code the caller gets (UNAUTHENTICATED or PERMISSION_DENIED) and Reason
// what the caller can do about it. It never contains the credential.
type Error struct {
	Code   codes.Code
	Reason string
}

func (e *Error) Error() string { return e.Reason }

func unauthenticated(format string, args ...any) error {
	return &Error{Code: codes.Unauthenticated, Reason: fmt.Sprintf(format, args...)}
}

func denied(format string, args ...any) error {
	return &Error{Code: codes.PermissionDenied, Reason: fmt.Sprintf(format, args...)}
}

// errNoCredential is the reason of a request without a bearer credential.
var errNoCredential = unauthenticated("missing credentials: send the metadata `authorization: Bearer <token>` (dsh: --token or DSH_TOKEN)")

// None authenticates every request as Local (--auth none).
type None struct{}

// Authenticate implements Authenticator.
func (None) Authenticate(context.Context, string) (Principal, error) { return Local(), nil }

// Tokens authenticates opaque bearer tokens listed by their SHA-256 (--auth
// token). The token file holds one line per token:
//
//	sha256:<hex of sha256(token)> <tenant> <subject> <role,role>
//
// with blank lines and lines starting with # ignored.
type Tokens struct {
	byHash map[[sha256.Size]byte]Principal
}

// LoadTokens reads a token file; a bad line fails naming its number.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--auth-tokens: %w", err)
	}
	defer f.Close()
	t, err := ParseTokens(f)
	if err != nil {
		return nil, fmt.Errorf("--auth-tokens %s: %w", path, err)
	}
	return t, nil
}

// ParseTokens parses the token file format (see Tokens).
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{byHash: map[[sha256.Size]byte]Principal{}}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		h, p, err := parseTokenLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if _, dup := t.byHash[h]; dup {
			return nil, fmt.Errorf("line %d: the same token hash is listed twice", n)
		}
		t.byHash[h] = p
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	return t, nil
}

func parseTokenLine(line string) ([sha256.Size]byte, Principal, error) {
	var h [sha256.Size]byte
	f := strings.Fields(line)
	if len(f) != 4 {
		return h, Principal{}, fmt.Errorf("want 4 fields `sha256:<hex> <tenant> <subject> <role,role>`, got %d", len(f))
	}
	hexs, ok := strings.CutPrefix(f[0], "sha256:")
	if !ok {
		return h, Principal{}, errors.New("the first field must start with sha256: (the token's SHA-256 in hex: `echo -n TOKEN | sha256sum`)")
	}
	b, err := hex.DecodeString(hexs)
	if err != nil || len(b) != sha256.Size {
		return h, Principal{}, errors.New("the token hash must be 64 hex digits (`echo -n TOKEN | sha256sum`)")
	}
	copy(h[:], b)
	p := Principal{Tenant: f[1], Subject: f[2]}
	for r := range strings.SplitSeq(f[3], ",") {
		role, err := ParseRole(r)
		if err != nil {
			return h, Principal{}, err
		}
		p.Roles = append(p.Roles, role)
	}
	return h, p, nil
}

// Len is the number of tokens.
func (t *Tokens) Len() int { return len(t.byHash) }

// Authenticate implements Authenticator. The token is compared by its hash,
// so the lookup time does not depend on how much of a token matches.
func (t *Tokens) Authenticate(_ context.Context, bearer string) (Principal, error) {
	if bearer == "" {
		return Principal{}, errNoCredential
	}
	p, ok := t.byHash[sha256.Sum256([]byte(bearer))]
	if !ok {
		return Principal{}, unauthenticated("unknown token: it is not in the agent's token file (check DSH_TOKEN / --token)")
	}
	return p, nil
}
