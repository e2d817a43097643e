package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/pgtest"
)

// TestReplicaHealth: a replica on PostgreSQL serves the gRPC health service
// in plaintext on --health-listen (kubelet's gRPC readiness probe); it is
// SERVING while the database answers, NOT_SERVING (for the overall server
// and the agent service) while the database refuses connections, and
// SERVING again once it is back. The health port serves nothing else.
func TestReplicaHealth(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.Database(t)
	healthAddr := freeAddr(t)
	s := startStackWith(t, &stack{nats: natstest.Start(t), agentEnv: []string{"DSH_STORE=postgres", "DSH_POSTGRES_DSN=" + dsn},
		agentArgs: []string{"--health-listen", healthAddr}})
	s.createSession(ctx) // the replica holds a lease to renew

	conn, err := grpcserver.Dial(healthAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	waitHealth := func(service string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			if err == nil && resp.GetStatus() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %q: %v, %v; want %v", service, resp.GetStatus(), err, want)
			}
			time.Sleep(100 * time.Millisecond) // polling the 2 s health period
		}
	}
	svc := agentv1.AgentService_ServiceDesc.ServiceName
	waitHealth("", healthpb.HealthCheckResponse_SERVING)
	waitHealth(svc, healthpb.HealthCheckResponse_SERVING)

	// The plaintext port is health only: the agent's API is not there.
	if _, err := agentv1.NewAgentServiceClient(conn).ListSessions(ctx, &agentv1.ListSessionsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListSessions on the health port = %v, want Unimplemented", err)
	}

	// The database refuses connections and drops the replica's: NOT_SERVING.
	name := dsn[strings.LastIndex(dsn, "dbname=")+len("dbname="):]
	admin, err := pgx.Connect(ctx, dsn[:strings.LastIndex(dsn, "dbname=")]+"dbname=postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`ALTER DATABASE "` + name + `" ALLOW_CONNECTIONS false`)
	exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '` + name + `'`)
	waitHealth("", healthpb.HealthCheckResponse_NOT_SERVING)
	waitHealth(svc, healthpb.HealthCheckResponse_NOT_SERVING)

	exec(`ALTER DATABASE "` + name + `" ALLOW_CONNECTIONS true`)
	waitHealth("", healthpb.HealthCheckResponse_SERVING)
	waitHealth(svc, healthpb.HealthCheckResponse_SERVING)
}
