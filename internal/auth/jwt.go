package auth

import (
	"context"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// AllowedAlgorithms are the JWS algorithms the agent accepts: asymmetric
// only, so neither "none" nor an HMAC keyed with a public key can pass.
var AllowedAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

// JWTConfig configures JWT authentication (--auth jwt).
type JWTConfig struct {
	// JWKS is a file path or an https:// URL serving the issuer's JSON Web
	// Key Set.
	JWKS string
	// Issuer and Audience are the required iss and aud (aud may be a list
	// containing it). Empty skips the check (not recommended).
	Issuer, Audience string
	// ClockSkew is the leeway on exp, nbf and iat; default 1m.
	ClockSkew time.Duration
	// TenantClaim and RolesClaim name the claims carrying the tenant (a
	// string) and the roles (an array of strings, or one string of names
	// separated by spaces or commas); defaults "tenant" and "roles".
	TenantClaim, RolesClaim string
	// Refresh is how often the key set is re-read; default 5m. A token with
	// an unknown kid, or any token while no key set is loaded, triggers an
	// early refresh (at most once per MinRefresh).
	Refresh, MinRefresh time.Duration
	// HTTPClient fetches a URL key set; nil means a client with a 10 s
	// timeout using the system roots (SSL_CERT_FILE works).
	HTTPClient *http.Client
	// CacheSize bounds the verified-token cache (see JWT); 0 means 4096,
	// negative disables it.
	CacheSize int
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// JWT authenticates signed JWTs against a JWKS that it keeps fresh.
//
// A token that verified is remembered by its SHA-256 until it expires (exp
// plus the clock skew) or the key set is reloaded, so a client reusing its
// token pays the signature check once, not per RPC. Only successes are
// cached; an entry answers only the exact same token bytes.
type JWT struct {
	cache *tokenCache

	cfg  JWTConfig
	log  *slog.Logger
	keys atomic.Pointer[keySet]
	kick chan struct{}
	stop context.CancelFunc
	wg   sync.WaitGroup

	lastErr atomic.Pointer[string]
}

type keySet struct {
	keys []jose.JSONWebKey
}

// NewJWT loads the key set and starts refreshing it until Close. A key set
// that is a file must load now; a URL that cannot be fetched now is logged
// and retried, and until keys load every request is UNAUTHENTICATED.
func NewJWT(ctx context.Context, cfg JWTConfig) (*JWT, error) {
	if cfg.JWKS == "" {
		return nil, errors.New("--auth jwt needs --jwt-jwks (a JWKS file or https:// URL)")
	}
	if strings.HasPrefix(cfg.JWKS, "http://") {
		return nil, fmt.Errorf("--jwt-jwks %s: keys must come over https:// (or from a file)", cfg.JWKS)
	}
	if cfg.ClockSkew == 0 {
		cfg.ClockSkew = time.Minute
	}
	if cfg.TenantClaim == "" {
		cfg.TenantClaim = "tenant"
	}
	if cfg.RolesClaim == "" {
		cfg.RolesClaim = "roles"
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Minute
	}
	if cfg.MinRefresh <= 0 {
		cfg.MinRefresh = 10 * time.Second
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	j := &JWT{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1)}
	switch {
	case cfg.CacheSize == 0:
		j.cache = newTokenCache(4096)
	case cfg.CacheSize > 0:
		j.cache = newTokenCache(cfg.CacheSize)
	}
	if err := j.reload(ctx); err != nil {
		if !j.isURL() {
			return nil, err
		}
		j.log.Error("JWKS not loaded at start; serving UNAUTHENTICATED until it loads", "jwks", cfg.JWKS, "err", err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	j.stop = cancel
	j.wg.Go(func() { j.refresher(rctx) })
	return j, nil
}

// Close stops refreshing.
func (j *JWT) Close() {
	j.stop()
	j.wg.Wait()
}

func (j *JWT) isURL() bool { return strings.HasPrefix(j.cfg.JWKS, "https://") }

func (j *JWT) refresher(ctx context.Context) {
	t := time.NewTicker(j.cfg.Refresh)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-j.kick:
			if wait := j.cfg.MinRefresh - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
		last = time.Now()
		if err := j.reload(ctx); err != nil {
			j.log.Warn("JWKS refresh failed; keeping the previous keys", "jwks", j.cfg.JWKS, "err", err)
		}
	}
}

// refreshSoon asks the refresher for an early reload.
func (j *JWT) refreshSoon() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

func (j *JWT) reload(ctx context.Context) error {
	b, err := j.fetch(ctx)
	if err == nil {
		var ks *keySet
		if ks, err = parseKeySet(b); err == nil {
			first := j.keys.Load() == nil
			j.keys.Store(ks)
			j.lastErr.Store(nil)
			if first {
				j.log.Info("JWKS loaded", "jwks", j.cfg.JWKS, "keys", len(ks.keys))
			}
			return nil
		}
	}
	msg := err.Error()
	j.lastErr.Store(&msg)
	return err
}

func (j *JWT) fetch(ctx context.Context) ([]byte, error) {
	if !j.isURL() {
		b, err := os.ReadFile(j.cfg.JWKS)
		if err != nil {
			return nil, fmt.Errorf("read --jwt-jwks: %w", err)
		}
		return b, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.cfg.JWKS, nil)
	if err != nil {
		return nil, fmt.Errorf("--jwt-jwks: %w", err)
	}
	resp, err := j.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch JWKS: HTTP %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	return b, nil
}

// parseKeySet keeps the public signing keys of a JWKS document.
func parseKeySet(b []byte) (*keySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("JWKS is not a JSON Web Key Set: %w", err)
	}
	ks := &keySet{}
	for _, k := range set.Keys {
		if k.Use == "enc" {
			continue
		}
		if !k.IsPublic() {
			k = k.Public()
		}
		switch key := k.Key.(type) {
		case nil, []byte:
			continue // symmetric: never accepted
		case *rsa.PublicKey:
			if key.N.BitLen() < 2048 {
				continue
			}
		}
		if !k.Valid() {
			continue
		}
		ks.keys = append(ks.keys, k)
	}
	if len(ks.keys) == 0 {
		return nil, errors.New("JWKS holds no usable public signing key (symmetric keys are refused; RSA keys need 2048 bits or more)")
	}
	return ks, nil
}

// jwsHeader is the part of the protected header read before verification,
// only to choose the key and to say what is wrong.
type jwsHeader struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// Authenticate implements Authenticator.
func (j *JWT) Authenticate(_ context.Context, bearer string) (Principal, error) {
	if bearer == "" {
		return Principal{}, errNoCredential
	}
	ks := j.keys.Load()
	now := j.cfg.Now()
	sum := sha256.Sum256([]byte(bearer))
	if p, ok := j.cache.get(sum, ks, now); ok {
		return p, nil
	}
	h, err := peekHeader(bearer)
	if err != nil {
		return Principal{}, err
	}
	if !slices.Contains(AllowedAlgorithms, jose.SignatureAlgorithm(h.Alg)) {
		if h.Alg == "none" || h.Alg == "" {
			return Principal{}, unauthenticated("unsigned token (alg %q): the agent accepts only tokens signed with %s", h.Alg, algList())
		}
		return Principal{}, unauthenticated("token algorithm %s is not accepted: the agent accepts only asymmetric signatures (%s)", h.Alg, algList())
	}
	if ks == nil {
		j.refreshSoon()
		reason := "not fetched yet"
		if e := j.lastErr.Load(); e != nil {
			reason = *e
		}
		return Principal{}, unauthenticated("the agent has no signing keys yet (JWKS %s: %s); retry shortly", j.cfg.JWKS, reason)
	}
	key, err := ks.pick(h)
	if err != nil {
		if h.Kid != "" {
			j.refreshSoon()
		}
		return Principal{}, err
	}
	tok, err := jwt.ParseSigned(bearer, AllowedAlgorithms)
	if err != nil {
		return Principal{}, unauthenticated("malformed token: %s", trimJose(err))
	}
	var std jwt.Claims
	var extra map[string]any
	if err := tok.Claims(key.Key, &std, &extra); err != nil {
		return Principal{}, unauthenticated("token signature does not verify with key %q: the token was not issued by the configured issuer's keys", key.KeyID)
	}
	if err := j.checkClaims(&std, now); err != nil {
		return Principal{}, err
	}
	p, err := j.principal(&std, extra)
	if err != nil {
		return Principal{}, err
	}
	until := std.Expiry.Time().Add(j.cfg.ClockSkew)
	j.cache.put(sum, ks, p, until, now)
	return p, nil
}

func (j *JWT) checkClaims(c *jwt.Claims, now time.Time) error {
	skew := j.cfg.ClockSkew
	if c.Expiry == nil {
		return unauthenticated("token has no exp claim: the agent accepts only tokens that expire")
	}
	if exp := c.Expiry.Time(); now.After(exp.Add(skew)) {
		return unauthenticated("token expired at %s (%s ago, clock skew allowed %s): get a new token", exp.UTC().Format(time.RFC3339), now.Sub(exp).Round(time.Second), skew)
	}
	if c.NotBefore != nil {
		if nbf := c.NotBefore.Time(); now.Add(skew).Before(nbf) {
			return unauthenticated("token is not valid before %s (clock skew allowed %s): check the issuer's and the agent's clocks", nbf.UTC().Format(time.RFC3339), skew)
		}
	}
	if c.IssuedAt != nil {
		if iat := c.IssuedAt.Time(); now.Add(skew).Before(iat) {
			return unauthenticated("token was issued in the future (%s; clock skew allowed %s): check the issuer's and the agent's clocks", iat.UTC().Format(time.RFC3339), skew)
		}
	}
	if j.cfg.Issuer != "" && c.Issuer != j.cfg.Issuer {
		return unauthenticated("token issuer %q is not the configured issuer %q", c.Issuer, j.cfg.Issuer)
	}
	if j.cfg.Audience != "" && !c.Audience.Contains(j.cfg.Audience) {
		return unauthenticated("token audience %q does not include %q: request a token for this agent", []string(c.Audience), j.cfg.Audience)
	}
	return nil
}

func (j *JWT) principal(c *jwt.Claims, extra map[string]any) (Principal, error) {
	p := Principal{Subject: c.Subject}
	tenant, _ := extra[j.cfg.TenantClaim].(string)
	if tenant == "" {
		return Principal{}, denied("token has no %q claim naming its tenant: ask the issuer to add it", j.cfg.TenantClaim)
	}
	p.Tenant = tenant
	var names []string
	switch v := extra[j.cfg.RolesClaim].(type) {
	case string:
		names = strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' })
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok {
				names = append(names, s)
			}
		}
	}
	for _, n := range names {
		// Roles of other applications may share the claim: skip them.
		if r, err := ParseRole(n); err == nil && !p.Has(r) {
			p.Roles = append(p.Roles, r)
		}
	}
	if len(p.Roles) == 0 {
		return Principal{}, denied("token of %q grants no dsh role in its %q claim (reader, writer or admin)", p.Subject, j.cfg.RolesClaim)
	}
	return p, nil
}

// pick chooses the verification key for a header.
func (ks *keySet) pick(h jwsHeader) (jose.JSONWebKey, error) {
	var cands []jose.JSONWebKey
	for _, k := range ks.keys {
		if h.Kid == "" || k.KeyID == h.Kid {
			cands = append(cands, k)
		}
	}
	switch {
	case len(cands) == 0:
		return jose.JSONWebKey{}, unauthenticated("token key id %q is not in the JWKS: the token is from another issuer, or the issuer rotated keys (the agent refreshes its key set)", h.Kid)
	case len(cands) > 1 && h.Kid == "":
		return jose.JSONWebKey{}, unauthenticated("token has no kid header and the JWKS holds %d keys: the issuer must set kid", len(cands))
	case len(cands) > 1:
		return jose.JSONWebKey{}, unauthenticated("the JWKS holds %d keys with id %q: the key set is ambiguous", len(cands), h.Kid)
	}
	k := cands[0]
	if k.Algorithm != "" && k.Algorithm != h.Alg {
		return jose.JSONWebKey{}, unauthenticated("token is signed %s but key %q is for %s", h.Alg, k.KeyID, k.Algorithm)
	}
	return k, nil
}

func peekHeader(tok string) (jwsHeader, error) {
	var h jwsHeader
	head, rest, ok := strings.Cut(tok, ".")
	if !ok || strings.Count(rest, ".") != 1 {
		return h, unauthenticated("malformed token: a JWT is three base64url parts separated by dots")
	}
	b, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return h, unauthenticated("malformed token: the header is not base64url")
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, unauthenticated("malformed token: the header is not a JSON object")
	}
	return h, nil
}

func algList() string {
	s := make([]string, len(AllowedAlgorithms))
	for i, a := range AllowedAlgorithms {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}

func trimJose(err error) string {
	s := err.Error()
	for _, p := range []string{"go-jose/go-jose/jwt: ", "go-jose/go-jose: "} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

// tokenCache remembers verified tokens by their SHA-256. An entry is valid
// only for the key set it was verified with and until its expiry; a nil
// cache remembers nothing.
type tokenCache struct {
	mu      sync.Mutex
	max     int
	entries map[[sha256.Size]byte]cached
}

type cached struct {
	p     Principal
	keys  *keySet
	until time.Time
}

func newTokenCache(max int) *tokenCache {
	return &tokenCache{max: max, entries: make(map[[sha256.Size]byte]cached)}
}

func (c *tokenCache) get(sum [sha256.Size]byte, ks *keySet, now time.Time) (Principal, bool) {
	if c == nil || ks == nil {
		return Principal{}, false
	}
	c.mu.Lock()
	e, ok := c.entries[sum]
	c.mu.Unlock()
	if !ok || e.keys != ks || !now.Before(e.until) {
		return Principal{}, false
	}
	return e.p, true
}

func (c *tokenCache) put(sum [sha256.Size]byte, ks *keySet, p Principal, until, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Full: drop the stale entries, or everything when none is stale
		// (a re-verification is the only cost).
		for k, e := range c.entries {
			if e.keys != ks || !now.Before(e.until) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			clear(c.entries)
		}
	}
	c.entries[sum] = cached{p: p, keys: ks, until: until}
}
