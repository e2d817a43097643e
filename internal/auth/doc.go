// Package auth is dsh's trust boundary, shared by every server and client:
//
//   - transport: server and client TLS configurations built from PEM files
//     (--tls-cert/--tls-key/--tls-client-ca on servers, --tls-ca/
//     --tls-client-cert/--tls-client-key on clients, DSH_TLS_* twins) that
//     re-read their files when they change on disk, so a rotated certificate
//     is used by the next handshake while established connections and
//     streams carry on (see Reloading);
//   - peer authorization: --allow-peer, the URI or DNS SANs a client
//     certificate must carry on servers only the agent may call;
//   - client authentication on the agent: --auth none|token|jwt, giving a
//     Principal{Tenant, Subject, Roles} in the request context;
//   - authorization at the edge: the Authorizer seam with the role-based
//     default (reader, writer, admin), every denial logged and counted;
//   - safe defaults: CheckListen refuses a plaintext or unauthenticated
//     non-loopback listener unless --insecure is given.
//
// # Reloading
//
// Certificate, key and CA files are stat'ed at each TLS handshake (one
// stat per file; handshakes happen per connection, not per RPC). When a
// file's modification time or size changed, the set is re-read; a set that
// does not load (a half-written rotation, a key that does not match) keeps
// the previous one in use and is logged, and the next handshake tries again.
//
// # What is never logged
//
// Tokens, token hashes and key material never reach a log line or an error
// message; denials name the principal, the RPC, the session and the reason.
package auth
