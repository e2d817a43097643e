package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// DefaultTenant is the tenant of sessions created without authentication
// (--auth none) and of stored sessions that predate tenancy.
const DefaultTenant = "default"

// Role is a set of permissions on the AgentService.
type Role string

// The roles. A writer can do what a reader can; an admin can do what a
// writer can, on any tenant.
const (
	RoleReader Role = "reader"
	RoleWriter Role = "writer"
	RoleAdmin  Role = "admin"
)

// ParseRole parses a role name.
func ParseRole(s string) (Role, error) {
	switch r := Role(strings.TrimSpace(s)); r {
	case RoleReader, RoleWriter, RoleAdmin:
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (roles are reader, writer, admin)", s)
}

// Principal is who a request comes from.
type Principal struct {
	// Tenant owns the sessions the principal creates and is the only tenant
	// whose sessions it sees (unless it is an admin).
	Tenant string
	// Subject names the caller (a JWT sub, a token file's subject, a
	// certificate identity) for logs.
	Subject string
	// Roles are the principal's roles.
	Roles []Role
}

// Has reports whether p holds role r.
func (p Principal) Has(r Role) bool { return slices.Contains(p.Roles, r) }

// Admin reports whether p may act on any tenant.
func (p Principal) Admin() bool { return p.Has(RoleAdmin) }

// Local is the principal of an unauthenticated local deployment (--auth
// none): the default tenant with every role.
func Local() Principal {
	return Principal{Tenant: DefaultTenant, Subject: "local", Roles: []Role{RoleReader, RoleWriter, RoleAdmin}}
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the edge put in ctx.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// TenantOf normalises a stored tenant: sessions stored before tenancy
// existed have none and belong to DefaultTenant.
func TenantOf(stored string) string {
	if stored == "" {
		return DefaultTenant
	}
	return stored
}

// CanSee reports whether p may see a session of tenant (stored value;
// normalised with TenantOf).
func (p Principal) CanSee(tenant string) bool {
	return p.Admin() || TenantOf(tenant) == p.Tenant
}
