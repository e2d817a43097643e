// The ToolHost gRPC service, the health service and serve().
//
// Requests: a malformed one (no execution, no name, a missing or relative
// cwd, a relative workspace root, arguments over maxArgumentBytes) is refused
// with INVALID_ARGUMENT, with the Go SDK's messages; everything else is a
// result.
//
// Delivery: Execute writes zero or more {output} messages and then exactly one
// {result}, then ends the stream. Cancelling the RPC aborts the call's
// AbortSignal; nothing more is written. WatchTools writes a full snapshot at
// once and after every change, tagged with a revision that grows on every
// change.
//
// Transport security: Server/serve() take the Go servers' three options,
// tlsCert and tlsKey (PEM files: TLS) and tlsClientCa (client certificates
// required and verified: mTLS), re-read when the files change; serve() reads
// DSH_TLS_CERT, DSH_TLS_KEY, DSH_TLS_CLIENT_CA when they are not given.
// allowPeers (DSH_ALLOW_PEER, comma-separated) lists the URI SANs (e.g.
// spiffe://dsh/agent) or DNS SANs a client certificate must carry; any other
// client gets PERMISSION_DENIED on every RPC. Listening on an address that is
// not loopback without TLS is refused with an error naming `insecure`
// (DSH_INSECURE=1), which starts it anyway with a warning.
//
// Environment: serve() reads DSH_INSECURE as the Go servers read a boolean
// variable: 1, t, true, yes or on is true; 0, f, false, no or off is false
// (any case; surrounding space is not trimmed, as in Go); unset or empty is the default
// (false). Any other value rejects with an EnvError naming the variable, the
// value and the accepted forms before anything listens, even when the
// `insecure` option is given: the operator set something wrong.
//
// Shutdown: on SIGTERM/SIGINT (or Server.stop()): health NOT_SERVING, watch
// streams end, running calls get `graceMs` to finish, then the rest are
// cancelled (their signals abort).

import fs from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import * as grpc from '@grpc/grpc-js'
import { file_dsh_tools_v1_tools } from '../gen/dsh/tools/v1/tools_pb.js'
import { file_grpc_health_v1_health } from '../gen/grpc/health/v1/health_pb.js'
import { file_grpc_reflection_v1_reflection } from '../gen/grpc/reflection/v1/reflection_pb.js'
import { REFLECTION_SERVICES, reflectionDefinition, reflectionHandlers } from './reflection.js'
import { loadProtos } from './proto.js'
import { callView, descriptor, executionMode, parseArguments, runCall, errorResult, toProtoResult, logFailure, stderrLogger } from './tool.js'
import { interceptorService } from './interceptor.js'

const TOOLHOST_SERVICE = 'dsh.tools.v1.ToolHost'
const INTERCEPTOR_SERVICE = 'dsh.tools.v1.ToolInterceptor'

/** path.normalize without a trailing slash (Go's filepath.Clean). */
const cleanPath = (p) => {
  const c = path.normalize(p)
  return c.length > 1 && c.endsWith('/') ? c.slice(0, -1) : c
}

/** A live set of tools; add/remove while serving and watchers get a new snapshot. */
export class ToolHost {
  #tools = new Map()
  #revision = 1
  #watchers = new Set()
  #closed = false

  /**
   * enforcesSandbox declares that these tools confine every call to its
   * context.sandbox policy (SANDBOX_SUPPORT_ENFORCED); leave it off unless
   * they really do: agents then refuse confined calls on this host.
   * workspaceContext(cwd, workspaceRoot) → GetWorkspaceContextResponse (or a
   * promise of it) answers GetWorkspaceContext for a host that owns a
   * workspace; without it the host owns none and answers an empty context.
   * workspaceRoot is the request's session root, cleaned ('' for the host's
   * root): read the context within it, so that a session cannot read
   * another's files through its context. It is passed only to a hook
   * declaring two parameters (`(cwd, opts = {})` has one, Function.length). logger.error(msg)
   * receives a tool's unexpected throw with its stack (default: stderr).
   */
  constructor(tools = [], { maxArgumentBytes = 1 << 20, enforcesSandbox = false, workspaceContext, logger = stderrLogger } = {}) {
    this.maxArgumentBytes = maxArgumentBytes
    this.logger = logger
    this.sandboxSupport = enforcesSandbox ? 'SANDBOX_SUPPORT_ENFORCED' : 'SANDBOX_SUPPORT_UNSPECIFIED'
    this.workspaceContext = workspaceContext
    for (const t of tools) this.#add(t)
  }

  /** Why a request is malformed (→ INVALID_ARGUMENT), or undefined. */
  checkRequest(req) {
    const ex = req.execution
    if (!ex) return 'execution is required'
    const c = ex.context ?? {}
    if (!ex.name) return 'execution.name is required'
    if (!c.cwd) return "execution.context.cwd is required: send the session's absolute working directory"
    if (!path.isAbsolute(c.cwd)) return `execution.context.cwd ${JSON.stringify(c.cwd)} must be an absolute path`
    if (c.workspaceRoot && !path.isAbsolute(c.workspaceRoot)) return `execution.context.workspace_root ${JSON.stringify(c.workspaceRoot)} must be an absolute path`
    const n = Buffer.byteLength(ex.arguments ?? '', 'utf8')
    if (n > this.maxArgumentBytes) return `execution.arguments is ${n} bytes, over this host's limit of ${this.maxArgumentBytes} bytes`
    return undefined
  }

  #add(t) {
    if (!t || typeof t.execute !== 'function' || typeof t.name !== 'string') throw new TypeError('not a tool; build it with defineTool or rawTool')
    if (this.#tools.has(t.name)) throw new Error(`duplicate tool ${JSON.stringify(t.name)}`)
    this.#tools.set(t.name, t)
  }

  /** Register a tool. */
  add(t) {
    this.#add(t)
    this.#changed()
  }

  /** Unregister a tool; returns whether it existed. */
  remove(name) {
    const ok = this.#tools.delete(name)
    if (ok) this.#changed()
    return ok
  }

  get(name) {
    return this.#tools.get(name)
  }

  get revision() {
    return this.#revision
  }

  snapshot() {
    return { tools: [...this.#tools.values()].map(descriptor), revision: String(this.#revision), sandboxSupport: this.sandboxSupport }
  }

  #changed() {
    this.#revision++
    const snap = this.snapshot()
    for (const w of this.#watchers) w(snap)
  }

  /** End every WatchTools stream. */
  close() {
    this.#closed = true
    for (const w of this.#watchers) w(null)
    this.#watchers.clear()
  }

  /** The grpc-js service implementation. */
  handlers() {
    return {
      ListTools: (_call, cb) => cb(null, this.snapshot()),
      WatchTools: (call) => {
        if (this.#closed) return call.end()
        const w = (snap) => (snap === null ? call.end() : call.write(snap))
        this.#watchers.add(w)
        call.on('cancelled', () => this.#watchers.delete(w))
        call.on('close', () => this.#watchers.delete(w))
        call.write(this.snapshot())
      },
      GetWorkspaceContext: (call, cb) => {
        const cwd = call.request.cwd ?? ''
        if (!cwd || !path.isAbsolute(cwd)) {
          cb({ code: grpc.status.INVALID_ARGUMENT, details: `cwd ${JSON.stringify(cwd)} must be an absolute path` })
          return
        }
        const root = call.request.workspaceRoot ?? ''
        if (root && !path.isAbsolute(root)) {
          cb({ code: grpc.status.INVALID_ARGUMENT, details: `workspace_root ${JSON.stringify(root)} must be an absolute path (or empty for the host's root)` })
          return
        }
        if (!this.workspaceContext) return cb(null, {})
        Promise.resolve()
          // A one-parameter hook (fn.length counts the parameters before
          // the first default) is called with the cwd only.
          .then(() => (this.workspaceContext.length >= 2 ? this.workspaceContext(cleanPath(cwd), root ? cleanPath(root) : '') : this.workspaceContext(cleanPath(cwd))))
          .then((resp) => cb(null, resp), (e) => cb({ code: grpc.status.INTERNAL, details: `workspace context: ${e instanceof Error ? e.message : String(e)}` }))
      },
      PrepareCalls: (call, cb) => {
        const calls = (call.request.executions ?? []).map((ex) => {
          const out = { callId: ex.callId, mode: 'EXECUTION_MODE_EXCLUSIVE' }
          const t = this.#tools.get(ex.name)
          if (!t) return out
          const parsed = parseArguments(ex.arguments ?? '')
          if (parsed.error) return out
          out.mode = executionMode(t, parsed.args)
          const v = callView(t, parsed.args)
          if (v) out.view = v
          return out
        })
        cb(null, { calls })
      },
      // EndSession: this host holds nothing per session, so ending one is a
      // no-op once the request names a session.
      EndSession: (call, cb) => {
        if (!call.request.sessionId) {
          cb({ code: grpc.status.INVALID_ARGUMENT, details: 'session_id is required' })
          return
        }
        cb(null, { tasksStopped: 0 })
      },
      Execute: (call) => {
        const bad = this.checkRequest(call.request)
        if (bad) {
          call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: bad })
          return
        }
        const ex = call.request.execution
        const ac = new AbortController()
        let finished = false
        const abort = () => {
          if (!finished) ac.abort(new Error('tool call aborted'))
        }
        call.on('cancelled', abort)
        const emit = (stream, text) => {
          if (!ac.signal.aborted) call.write({ output: { stream, text } })
        }
        runCall(this.#tools.get(ex.name), ex, { signal: ac.signal, emit, logger: this.logger })
          .catch((e) => {
            logFailure(this.logger, ex.name, { callId: ex.callId, sessionId: ex.context?.sessionId }, e)
            return toProtoResult(errorResult(e instanceof Error ? e.message : String(e)))
          })
          .then((result) => {
            finished = true
            if (ac.signal.aborted) return
            call.write({ result })
            call.end()
          })
      },
    }
  }
}

/** The standard grpc.health.v1 service. */
export class Health {
  #status = new Map()
  #watchers = new Set()

  set(service, status) {
    this.#status.set(service, status)
    for (const w of this.#watchers) w()
  }

  shutdown() {
    for (const k of this.#status.keys()) this.#status.set(k, 'NOT_SERVING')
    for (const w of this.#watchers) w(true)
  }

  handlers() {
    return {
      Check: (call, cb) => {
        const st = this.#status.get(call.request.service ?? '')
        if (st === undefined) return cb({ code: grpc.status.NOT_FOUND, details: `unknown service ${JSON.stringify(call.request.service)}` })
        cb(null, { status: st })
      },
      Watch: (call) => {
        let last
        const send = (end) => {
          const st = this.#status.get(call.request.service ?? '') ?? 'SERVICE_UNKNOWN'
          if (st !== last) {
            last = st
            call.write({ status: st })
          }
          if (end === true) call.end()
        }
        this.#watchers.add(send)
        call.on('cancelled', () => this.#watchers.delete(send))
        send()
      },
    }
  }
}

/**
 * An environment variable whose value does not parse; serve() rejects with it
 * before anything listens. The message has the Go servers' shape:
 * `NAME="VALUE": REASON` (the reason gives the accepted forms and the default;
 * the value is quoted as a JSON string, which is Go's %q for printable text).
 */
export class EnvError extends Error {
  constructor(variable, value, reason) {
    super(`${variable}=${JSON.stringify(value)}: ${reason}`)
    this.name = 'EnvError'
    this.variable = variable
    this.value = value
    this.reason = reason
  }
}

const TRUE_FORMS = new Set(['1', 't', 'true', 'yes', 'on'])
const FALSE_FORMS = new Set(['0', 'f', 'false', 'no', 'off'])

/**
 * The boolean in env[name]: 1, t, true, yes or on; 0, f, false, no or off (any
 * case; surrounding space is not trimmed, as in Go); unset or empty gives def; anything else
 * throws an EnvError.
 */
export function envBool(env, name, def) {
  const value = env[name] ?? ''
  const v = value.toLowerCase()
  if (v === '') return def
  if (TRUE_FORMS.has(v)) return true
  if (FALSE_FORMS.has(v)) return false
  throw new EnvError(name, value, `not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means ${def}`)
}

/** A transport-security option that cannot work; the message names it. */
export class TLSConfigError extends Error {
  constructor(message) {
    super(message)
    this.name = 'TLSConfigError'
  }
}

/** Whether a listen address (HOST:PORT, [V6]:PORT, unix:PATH) stays on this machine. */
export function isLoopback(address) {
  if (address.startsWith('unix:')) return true
  const host = address.slice(0, address.lastIndexOf(':')).replace(/^\[|\]$/g, '')
  if (host === 'localhost') return true
  if (net.isIPv4(host)) return host.startsWith('127.')
  if (net.isIPv6(host)) return host === '::1' || host === '0:0:0:0:0:0:0:1'
  return false
}

function readPEM(file, option) {
  let b
  try {
    b = fs.readFileSync(file)
  } catch (e) {
    throw new TLSConfigError(`${option} ${JSON.stringify(file)}: ${e.code ?? e.message}`)
  }
  if (!b.includes('-----BEGIN')) throw new TLSConfigError(`${option} ${JSON.stringify(file)}: not a PEM file`)
  return b
}

/** The URI and DNS SANs of a call's client certificate. */
function peerIdentities(call) {
  const alt = call.getAuthContext?.()?.sslPeerCertificate?.subjectaltname ?? ''
  return alt.split(', ').flatMap((e) => (e.startsWith('URI:') ? [e.slice(4)] : e.startsWith('DNS:') ? [e.slice(4)] : []))
}

/** Wrap every handler of a service so a caller without an allowed identity gets PERMISSION_DENIED. */
function guard(service, handlers, allowed) {
  const out = {}
  for (const [name, fn] of Object.entries(handlers)) {
    const streaming = service[name]?.responseStream
    out[name] = (call, cb) => {
      const ids = peerIdentities(call)
      if (ids.some((id) => allowed.has(id))) return fn(call, cb)
      const err = { code: grpc.status.PERMISSION_DENIED, details: `client certificate identities ${JSON.stringify(ids.length ? ids : ['(none)'])} are not among the allowed peers` }
      if (streaming) call.emit('error', err)
      else cb(err)
    }
  }
  return out
}

/**
 * A running server: ToolHost (+ optional ToolInterceptor) + health + server
 * reflection (v1 and v1alpha) on one port.
 * tlsCert/tlsKey serve TLS, tlsClientCa requires client certificates (mTLS),
 * allowPeers limits callers to those URI or DNS SANs; insecure allows a
 * plaintext non-loopback listen.
 */
export class Server {
  constructor({ host, interceptor, tlsCert, tlsKey, tlsClientCa, allowPeers = [], insecure = false, refreshIntervalMs = 1000 } = {}) {
    if (!host && !interceptor) throw new TypeError('serve a ToolHost, an interceptor, or both')
    allowPeers = allowPeers.filter(Boolean)
    if (!!tlsCert !== !!tlsKey) throw new TLSConfigError('tlsCert and tlsKey go together (DSH_TLS_CERT, DSH_TLS_KEY)')
    if (tlsClientCa && !tlsCert) throw new TLSConfigError('tlsClientCa needs tlsCert and tlsKey: client certificates are checked over TLS')
    if (allowPeers.length > 0 && !tlsClientCa) {
      throw new TLSConfigError('allowPeers needs tlsClientCa (DSH_TLS_CLIENT_CA): without client certificates there is no identity to check')
    }
    this.insecure = insecure
    this.credentials = grpc.ServerCredentials.createInsecure()
    if (tlsCert) {
      readPEM(tlsCert, 'tlsCert')
      readPEM(tlsKey, 'tlsKey')
      if (tlsClientCa) readPEM(tlsClientCa, 'tlsClientCa')
      // The files are re-read every refreshIntervalMs; a new handshake gets
      // the new certificate, established connections keep theirs.
      const provider = new grpc.experimental.FileWatcherCertificateProvider({
        certificateFile: tlsCert, privateKeyFile: tlsKey, caCertificateFile: tlsClientCa || undefined, refreshIntervalMs,
      })
      this.credentials = grpc.experimental.createCertificateProviderServerCredentials(provider, tlsClientCa ? provider : null, !!tlsClientCa)
      this.provider = provider
      this.needsCa = !!tlsClientCa
    }
    this.secure = !!tlsCert
    const protos = loadProtos()
    const allowed = new Set(allowPeers)
    const add = (service, handlers) => this.grpc.addService(service, allowed.size > 0 ? guard(service, handlers, allowed) : handlers)
    this.host = host
    this.health = new Health()
    this.grpc = new grpc.Server()
    if (host) {
      add(protos.tools.ToolHost.service, host.handlers())
      this.health.set(TOOLHOST_SERVICE, 'SERVING')
    }
    if (interceptor) {
      add(protos.tools.ToolInterceptor.service, interceptorService(interceptor))
      this.health.set(INTERCEPTOR_SERVICE, 'SERVING')
    }
    add(protos.health.Health.service, this.health.handlers())
    // Server reflection (v1 and v1alpha) of the services above, so grpcurl
    // and other generic clients work without the .proto files, as on every
    // Go dsh server.
    const served = [host && TOOLHOST_SERVICE, interceptor && INTERCEPTOR_SERVICE, 'grpc.health.v1.Health'].filter(Boolean)
    const reflection = reflectionHandlers(served, [file_dsh_tools_v1_tools, file_grpc_health_v1_health, file_grpc_reflection_v1_reflection])
    for (const name of REFLECTION_SERVICES) add(reflectionDefinition(name), reflection)
  }

  /** Bind and start; resolves to the bound "host:port". */
  listen(address = '127.0.0.1:0') {
    if (!this.secure && !isLoopback(address)) {
      if (!this.insecure) {
        return Promise.reject(new TLSConfigError(`refusing to listen on ${address} without TLS: give tlsCert and tlsKey (DSH_TLS_CERT, DSH_TLS_KEY), or set insecure (DSH_INSECURE=1) to serve plaintext`))
      }
      process.stderr.write(`WARN dsh-toolhost: insecure: serving plaintext on ${address}; anyone who reaches it can run its tools\n`)
    }
    return new Promise((resolve, reject) => {
      this.grpc.bindAsync(address, this.credentials, (err, port) => {
        if (err) return reject(err)
        const hostPart = address.slice(0, address.lastIndexOf(':'))
        this.address = `${hostPart}:${port}`
        // The provider reads the files asynchronously; serve once the server
        // has them (its listeners were added at bind, so they run first).
        this.#loaded().then(() => {
          this.health.set('', 'SERVING')
          resolve(this.address)
        })
      })
    })
  }

  #loaded() {
    const p = this.provider
    if (!p) return Promise.resolve()
    const first = (add, remove) => new Promise((resolve) => {
      const l = (u) => {
        if (!u) return
        remove.call(p, l)
        resolve()
      }
      add.call(p, l)
    })
    return Promise.all([
      first(p.addIdentityCertificateListener, p.removeIdentityCertificateListener),
      this.needsCa ? first(p.addCaCertificateListener, p.removeCaCertificateListener) : null,
    ])
  }

  /** Graceful shutdown: NOT_SERVING, end watches, drain for graceMs, then cancel the rest. */
  stop(graceMs = 5000) {
    if (this.stopping) return this.stopping
    this.health.shutdown()
    this.host?.close()
    this.stopping = new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.grpc.forceShutdown()
        resolve()
      }, graceMs)
      this.grpc.tryShutdown(() => {
        clearTimeout(timer)
        resolve()
      })
    })
    return this.stopping
  }
}

/**
 * Serve tools until SIGTERM/SIGINT, then shut down gracefully. The address
 * defaults to $DSH_LISTEN or 127.0.0.1:0; the bound address is printed on
 * stdout as `dsh-toolhost listening on HOST:PORT`. The TLS options default to
 * $DSH_TLS_CERT, $DSH_TLS_KEY, $DSH_TLS_CLIENT_CA, $DSH_ALLOW_PEER
 * (comma-separated) and $DSH_INSECURE (see Server): true is 1, t, true, yes
 * or on, false is 0, f, false, no or off (any case, no surrounding space, as
 * in Go), unset or empty is false. Any other value of $DSH_INSECURE rejects
 * with an EnvError (naming the variable, the value and the accepted forms)
 * before anything listens, even when `insecure` is given, which otherwise
 * wins over the variable.
 */
export async function serve(tools = [], { host, address, interceptor, graceMs = 5000, tlsCert, tlsKey, tlsClientCa, allowPeers, insecure } = {}) {
  const env = process.env
  const envInsecure = envBool(env, 'DSH_INSECURE', false) // first: a malformed value is refused even if insecure is given
  if (!host && (tools.length > 0 || !interceptor)) host = new ToolHost(tools)
  else if (host) for (const t of tools) host.add(t)
  const srv = new Server({
    host,
    interceptor,
    tlsCert: tlsCert || env.DSH_TLS_CERT,
    tlsKey: tlsKey || env.DSH_TLS_KEY,
    tlsClientCa: tlsClientCa || env.DSH_TLS_CLIENT_CA,
    allowPeers: allowPeers ?? (env.DSH_ALLOW_PEER ?? '').split(',').map((p) => p.trim()).filter(Boolean),
    insecure: insecure ?? envInsecure,
  })
  const addr = await srv.listen(address || process.env.DSH_LISTEN || '127.0.0.1:0')
  process.stdout.write(`dsh-toolhost listening on ${addr}\n`)
  const onSignal = () => {
    process.stderr.write('dsh-toolhost shutting down\n')
    srv.stop(graceMs).then(() => process.exit(0))
  }
  process.once('SIGTERM', onSignal)
  process.once('SIGINT', onSignal)
  return srv
}
