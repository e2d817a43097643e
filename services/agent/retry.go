package agent

// ClientServiceConfig is the gRPC service config clients of AgentService
// should dial with (docs/API.md "Retries and request_id"): it retries
// UNAVAILABLE (a lost connection, a restarting agent) on the reads and on
// the commands made idempotent by their request_id. A client using it must
// set request_id on every CreateSession, Send, Steer and Inject: a retry
// without one may run the command twice.
const ClientServiceConfig = `{
  "methodConfig": [{
    "name": [
      {"service": "dsh.agent.v1.AgentService", "method": "CreateSession"},
      {"service": "dsh.agent.v1.AgentService", "method": "Send"},
      {"service": "dsh.agent.v1.AgentService", "method": "Steer"},
      {"service": "dsh.agent.v1.AgentService", "method": "Inject"},
      {"service": "dsh.agent.v1.AgentService", "method": "GetSession"},
      {"service": "dsh.agent.v1.AgentService", "method": "ListSessions"},
      {"service": "dsh.agent.v1.AgentService", "method": "GetMessages"}
    ],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.2s",
      "maxBackoff": "5s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`
