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
// Shutdown: on SIGTERM/SIGINT (or Server.stop()): health NOT_SERVING, watch
// streams end, running calls get `graceMs` to finish, then the rest are
// cancelled (their signals abort).

import path from 'node:path'
import * as grpc from '@grpc/grpc-js'
import { loadProtos } from './proto.js'
import { callView, descriptor, executionMode, parseArguments, runCall, errorResult, toProtoResult } from './tool.js'
import { interceptorService } from './interceptor.js'

const TOOLHOST_SERVICE = 'dsh.tools.v1.ToolHost'

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
   * workspaceContext(cwd) → GetWorkspaceContextResponse (or a promise of it)
   * answers GetWorkspaceContext for a host that owns a workspace; without it
   * the host owns none and answers an empty context.
   */
  constructor(tools = [], { maxArgumentBytes = 1 << 20, workspaceContext } = {}) {
    this.maxArgumentBytes = maxArgumentBytes
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
    return { tools: [...this.#tools.values()].map(descriptor), revision: String(this.#revision) }
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
        if (!this.workspaceContext) return cb(null, {})
        Promise.resolve()
          .then(() => this.workspaceContext(cleanPath(cwd)))
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
        runCall(this.#tools.get(ex.name), ex, { signal: ac.signal, emit })
          .catch((e) => toProtoResult(errorResult(e instanceof Error ? e.message : String(e))))
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

/** A running server: ToolHost (+ optional ToolInterceptor) + health on one port. */
export class Server {
  constructor({ host, interceptor } = {}) {
    if (!host && !interceptor) throw new TypeError('serve a ToolHost, an interceptor, or both')
    const protos = loadProtos()
    this.host = host
    this.health = new Health()
    this.grpc = new grpc.Server()
    if (host) {
      this.grpc.addService(protos.tools.ToolHost.service, host.handlers())
      this.health.set(TOOLHOST_SERVICE, 'SERVING')
    }
    if (interceptor) {
      this.grpc.addService(protos.tools.ToolInterceptor.service, interceptorService(interceptor))
      this.health.set('dsh.tools.v1.ToolInterceptor', 'SERVING')
    }
    this.grpc.addService(protos.health.Health.service, this.health.handlers())
  }

  /** Bind and start; resolves to the bound "host:port". */
  listen(address = '127.0.0.1:0') {
    return new Promise((resolve, reject) => {
      this.grpc.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err, port) => {
        if (err) return reject(err)
        this.health.set('', 'SERVING')
        const hostPart = address.slice(0, address.lastIndexOf(':'))
        this.address = `${hostPart}:${port}`
        resolve(this.address)
      })
    })
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
 * stdout as `dsh-toolhost listening on HOST:PORT`.
 */
export async function serve(tools = [], { host, address, interceptor, graceMs = 5000 } = {}) {
  if (!host && (tools.length > 0 || !interceptor)) host = new ToolHost(tools)
  else if (host) for (const t of tools) host.add(t)
  const srv = new Server({ host, interceptor })
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
