package auth

import (
	"context"
	"fmt"
	"strings"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// Target is what a request wants to do.
type Target struct {
	// FullMethod is the gRPC method, "/dsh.agent.v1.AgentService/Send".
	FullMethod string
	// SessionID is the session the request names, when it names one.
	SessionID string
	// Tenant is the tenant the request names explicitly
	// (ListSessionsRequest.tenant), when it names one.
	Tenant string
}

// RPC is the method's short name ("Send").
func (t Target) RPC() string {
	return t.FullMethod[strings.LastIndexByte(t.FullMethod, '/')+1:]
}

// Authorizer decides whether a principal may do what a request asks. A
// non-nil error is a denial; its message says why (a *status.Status error
// chooses its own code, anything else is PERMISSION_DENIED). A deployment can
// plug in its own policy engine; Roles is the default.
type Authorizer interface {
	Authorize(ctx context.Context, p Principal, t Target) error
}

// AgentServiceRoles is the role each AgentService RPC needs. Methods not in
// the table are denied (fail closed) unless listed in OpenMethods.
var AgentServiceRoles = map[string]Role{
	agentv1.AgentService_GetSession_FullMethodName:    RoleReader,
	agentv1.AgentService_ListSessions_FullMethodName:  RoleReader,
	agentv1.AgentService_StreamEvents_FullMethodName:  RoleReader,
	agentv1.AgentService_GetMessages_FullMethodName:   RoleReader,
	agentv1.AgentService_WaitIdle_FullMethodName:      RoleReader,
	agentv1.AgentService_CreateSession_FullMethodName: RoleWriter,
	agentv1.AgentService_Send_FullMethodName:          RoleWriter,
	agentv1.AgentService_Steer_FullMethodName:         RoleWriter,
	agentv1.AgentService_Inject_FullMethodName:        RoleWriter,
	agentv1.AgentService_Cancel_FullMethodName:        RoleWriter,
	agentv1.AgentService_ForkSession_FullMethodName:   RoleWriter,
	agentv1.AgentService_Respond_FullMethodName:       RoleWriter,
	agentv1.AgentService_UpdateSession_FullMethodName: RoleWriter,
	agentv1.AgentService_Compact_FullMethodName:       RoleWriter,
	// Server reflection describes the API (no session data): readers.
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      RoleReader,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": RoleReader,
}

// Roles is the role-based Authorizer: a method needs the role of its table
// entry (a writer also holds reader's rights, an admin writer's); naming a
// tenant other than the principal's needs admin. Which sessions a principal
// sees is decided by the service after its lookup (another tenant's session
// is NOT_FOUND there), so that no answer here depends on a session's
// existence.
type Roles struct {
	// Table maps full method names to the role they need; nil means
	// AgentServiceRoles.
	Table map[string]Role
}

// Authorize implements Authorizer.
func (r Roles) Authorize(_ context.Context, p Principal, t Target) error {
	table := r.Table
	if table == nil {
		table = AgentServiceRoles
	}
	need, ok := table[t.FullMethod]
	if !ok {
		return fmt.Errorf("%s has no authorization rule; it is denied to everyone", t.FullMethod)
	}
	if !p.satisfies(need) {
		return fmt.Errorf("%s needs the %s role; the principal has %s", t.RPC(), need, rolesString(p.Roles))
	}
	if t.Tenant != "" && t.Tenant != p.Tenant && !p.Admin() {
		return fmt.Errorf("only an admin may name another tenant (%q) than its own (%q)", t.Tenant, p.Tenant)
	}
	return nil
}

// satisfies: admin implies writer implies reader.
func (p Principal) satisfies(need Role) bool {
	switch need {
	case RoleReader:
		return p.Has(RoleReader) || p.Has(RoleWriter) || p.Has(RoleAdmin)
	case RoleWriter:
		return p.Has(RoleWriter) || p.Has(RoleAdmin)
	default:
		return p.Has(need)
	}
}

func rolesString(rs []Role) string {
	if len(rs) == 0 {
		return "no role"
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ",")
}
