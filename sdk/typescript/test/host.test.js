import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import * as grpc from '@grpc/grpc-js'
import { defineTool, rawTool, ToolError, ToolHost, Server, Interceptor, deny, allow, block, loadProtos } from '../src/index.js'
import { conformanceTools } from '../src/conformance.js'

const here = path.dirname(fileURLToPath(import.meta.url))
const protos = loadProtos()

const boom = defineTool({ name: 'boom', parameters: { x: { type: 'integer', required: true } }, execute: async (a) => { throw new Error(`bad x ${a.x}`) } })
const typedFail = defineTool({ name: 'typed_fail', execute: () => { throw new ToolError('no such thing', 'FS_NOT_FOUND', 'FsError') } })
const syncThrow = defineTool({ name: 'sync_throw', execute: () => { throw 'a string' } })
const emitter = defineTool({ name: 'emitter', execute: async (_a, ctx) => { ctx.emit('out\n'); ctx.emit('err\n', 'stderr'); return 'done' } })
const badReturn = defineTool({ name: 'bad_return', execute: async () => [{ nope: 1 }] })
const policySeen = []
const policyProbe = defineTool({ name: 'policy_probe', execute: async (_a, ctx) => { policySeen.push(ctx.sandbox); return 'ok' } })
const raw = rawTool({ name: 'raw', parameters: { type: 'object', properties: { a: { type: 'string' } } }, execute: async (a) => JSON.stringify(a) })

let srv, client, stub
const logged = []
before(async () => {
  const host = new ToolHost([boom, typedFail, syncThrow, emitter, badReturn, raw, policyProbe], { logger: { error: (m) => logged.push(m) } })
  for (const t of conformanceTools(host)) host.add(t)
  srv = new Server({ host })
  const addr = await srv.listen('127.0.0.1:0')
  client = new protos.tools.ToolHost(addr, grpc.credentials.createInsecure())
  stub = { addr }
})
after(async () => {
  client.close()
  await srv.stop(500)
})

const exec = (name, args, callId = 'c1') => ({
  execution: { callId, name, arguments: typeof args === 'string' ? args : JSON.stringify(args), context: { sessionId: 's1', cwd: '/tmp' } },
})
const textOf = (r) => r.content.map((b) => b.text?.text ?? '').join('')

function run(name, args) {
  return new Promise((resolve, reject) => {
    const msgs = []
    const s = client.Execute(exec(name, args))
    s.on('data', (m) => msgs.push(m))
    s.on('error', reject)
    s.on('end', () => {
      const last = msgs.at(-1)
      if (!last || last.event !== 'result') return reject(new Error(`no result: ${JSON.stringify(msgs)}`))
      if (msgs.slice(0, -1).some((m) => m.event !== 'output')) return reject(new Error('result not last'))
      resolve({ outputs: msgs.slice(0, -1).map((m) => m.output), result: last.result })
    })
  })
}

const unary = (m, req) => new Promise((resolve, reject) => client[m](req, (e, r) => (e ? reject(e) : resolve(r))))

test('list and schema', async () => {
  const r = await unary('ListTools', {})
  const echo = r.tools.find((t) => t.schema.name === 'conf_echo')
  assert.equal(echo.concurrency, 'CONCURRENCY_SAFETY_ALWAYS')
  assert.equal(echo.validatesArguments, true)
  const p = JSON.parse(echo.schema.parameters)
  assert.deepEqual(p.required, ['text'])
  assert.deepEqual(p.properties.opts.required, ['flag'])
  assert.equal(r.tools.find((t) => t.schema.name === 'raw').validatesArguments, false)
})

test('sandbox policy reaches tools; hosts declare no enforcement by default', async () => {
  assert.equal((await unary('ListTools', {})).sandboxSupport, 'SANDBOX_SUPPORT_UNSPECIFIED')
  assert.equal(new ToolHost([], { enforcesSandbox: true }).snapshot().sandboxSupport, 'SANDBOX_SUPPORT_ENFORCED')
  const req = exec('policy_probe', {})
  req.execution.context.sandbox = { mode: 'SANDBOX_MODE_READ_ONLY', network: 'NETWORK_ACCESS_OFF' }
  await new Promise((resolve, reject) => {
    const s = client.Execute(req)
    s.on('data', () => {})
    s.on('error', reject)
    s.on('end', resolve)
  })
  await run('policy_probe', {})
  assert.deepEqual(policySeen, [{ mode: 'read-only', network: 'off' }, null])
})

test('results', async (t) => {
  const cases = [
    ['echo', 'conf_echo', { text: 'hi', mode: 'upper' }, 'HI', false, null],
    ['invalid', 'conf_echo', { mode: 'x', opts: {} }, 'Error: invalid arguments: missing required property "text"; "mode" must be one of [plain, upper]; missing required property "opts.flag"', true, ['ToolArgsError', 'INVALID_ARGS']],
    ['not json', 'conf_echo', '{', 'Error: invalid arguments: arguments are not valid JSON: unexpected end of JSON input', true, ['ToolArgsError', 'INVALID_ARGS']],
    ['not object', 'conf_echo', '[]', 'Error: invalid arguments: "arguments" must be an object', true, ['ToolArgsError', 'INVALID_ARGS']],
    ['unknown', 'nope', {}, 'Error: unknown tool "nope"', true, ['ToolNotFoundError', 'UNKNOWN_TOOL']],
    ['throws', 'boom', { x: 2 }, 'Error: bad x 2', true, null],
    ['throws a non-Error', 'sync_throw', {}, 'Error: a string', true, null],
    ['typed error', 'typed_fail', {}, 'Error: no such thing', true, ['FsError', 'FS_NOT_FOUND']],
    ['bad return', 'bad_return', {}, 'Error: a content block needs a type', true, null],
    ['raw unvalidated', 'raw', { a: 1 }, '{"a":1}', false, null],
  ]
  for (const [name, tool, args, want, isError, err] of cases) {
    await t.test(name, async () => {
      const { result } = await run(tool, args)
      assert.equal(textOf(result), want)
      assert.equal(result.isError, isError)
      if (err) assert.deepEqual([result.error.name, result.error.code], err)
      else assert.equal(result.error, null)
    })
  }
})

test('a throwing tool is logged at the host with its stack, the call and the session', () => {
  const line = logged.find((l) => l.includes('tool boom failed'))
  assert.ok(line, `no log line for boom in ${JSON.stringify(logged)}`)
  for (const want of ['call c1', 'session s1', 'bad x 2', 'Error: bad x 2\n    at ']) assert.ok(line.includes(want), `${want} missing from ${line}`)
  assert.ok(!logged.some((l) => l.includes('typed_fail')), 'a ToolError is a result, not a host failure')
})

test('meta and views', async () => {
  const { result } = await run('conf_echo', { text: 'abc' })
  assert.deepEqual(JSON.parse(result.meta), { length: 3 })
  assert.equal(result.view.generic.title, 'echoed abc')
  const prep = await unary('PrepareCalls', {
    executions: [exec('conf_echo', { text: 'a' }, '1'), exec('conf_echo', {}, '2'), exec('conf_slow', { key: 'k' }, '3'), exec('nope', {}, '4'), exec('conf_stream', { count: 2 }, '5')].map((e) => e.execution),
  })
  assert.deepEqual(prep.calls.map((c) => c.callId), ['1', '2', '3', '4', '5'])
  assert.equal(prep.calls[0].mode, 'EXECUTION_MODE_PARALLEL')
  assert.equal(prep.calls[0].view.generic.title, 'echo a')
  assert.equal(prep.calls[1].view, null)
  assert.equal(prep.calls[2].mode, 'EXECUTION_MODE_EXCLUSIVE')
  assert.equal(prep.calls[3].mode, 'EXECUTION_MODE_EXCLUSIVE')
  assert.equal(prep.calls[4].view.terminal.title, 'stream 2')
})

test('end session is a no-op that needs a session id', async () => {
  const r = await unary('EndSession', { sessionId: 's1' })
  assert.equal(r.tasksStopped, 0)
  await assert.rejects(unary('EndSession', {}), (e) => e.code === grpc.status.INVALID_ARGUMENT && /session_id/.test(e.details))
})

test('streaming', async () => {
  let { outputs, result } = await run('conf_stream', { count: 3 })
  assert.deepEqual(outputs.map((o) => o.text), ['chunk 1\n', 'chunk 2\n', 'chunk 3\n'])
  assert.equal(textOf(result), 'streamed 3')
  assert.equal(result.view.terminal.output, 'chunk 1\nchunk 2\nchunk 3\n')
  assert.equal(result.view.terminal.exitCode, 0)
  ;({ outputs } = await run('emitter', {}))
  assert.deepEqual(outputs.map((o) => [o.stream, o.text]), [['stdout', 'out\n'], ['stderr', 'err\n']])
})

test('cancellation reaches the tool', async () => {
  const s = client.Execute(exec('conf_slow', { key: 'k1' }))
  s.on('error', () => {})
  const [first] = await once(s, 'data')
  assert.equal(first.output.text, 'started k1')
  s.cancel()
  const deadline = Date.now() + 10000
  for (;;) {
    const { result } = await run('conf_status', { key: 'k1' })
    if (textOf(result) === 'cancelled') break
    assert.ok(Date.now() < deadline, `status stayed ${textOf(result)}`)
    await new Promise((r) => setTimeout(r, 10))
  }
})

test('concurrent calls', async () => {
  const rs = await Promise.all([1, 2, 3, 4].map(() => run('conf_barrier', { key: 'b', n: 4 })))
  assert.deepEqual(rs.map((r) => textOf(r.result)), Array(4).fill('released b'))
})

test('watch after add', async () => {
  const w = client.WatchTools({})
  w.on('error', () => {})
  const snaps = []
  w.on('data', (m) => snaps.push(m))
  const nth = async (n) => {
    const deadline = Date.now() + 10000
    while (snaps.length < n) {
      assert.ok(Date.now() < deadline, `only ${snaps.length} snapshots`)
      await new Promise((r) => setTimeout(r, 5))
    }
    return snaps[n - 1]
  }
  const first = await nth(1)
  assert.ok(!first.tools.some((t) => t.schema.name === 'conf_dyn_x'))
  const { result } = await run('conf_add_tool', { name: 'conf_dyn_x' })
  assert.equal(textOf(result), 'added conf_dyn_x')
  const second = await nth(2)
  assert.ok(Number(second.revision) > Number(first.revision))
  assert.ok(second.tools.some((t) => t.schema.name === 'conf_dyn_x'))
  assert.equal(textOf((await run('conf_dyn_x', {})).result), 'dynamic conf_dyn_x')
  w.cancel()
})

test('malformed requests are INVALID_ARGUMENT', async () => {
  const cases = {
    'no execution': {},
    'no cwd': { execution: { callId: 'c', name: 'conf_echo', arguments: '{}' } },
    'relative cwd': { execution: { callId: 'c', name: 'conf_echo', arguments: '{}', context: { cwd: 'rel' } } },
    'relative root': { execution: { callId: 'c', name: 'conf_echo', arguments: '{}', context: { cwd: '/', workspaceRoot: 'ws' } } },
    'too big': exec('conf_echo', `{"text":"${'x'.repeat(1 << 20)}"}`),
  }
  for (const [name, req] of Object.entries(cases)) {
    const err = await new Promise((resolve) => {
      const s = client.Execute(req)
      s.on('data', () => {})
      s.on('error', resolve)
      s.on('end', () => resolve(null))
    })
    assert.equal(err?.code, grpc.status.INVALID_ARGUMENT, `${name}: ${err?.details}`)
  }
})

test('health', async () => {
  const h = new protos.health.Health(stub.addr, grpc.credentials.createInsecure())
  const check = (service) => new Promise((resolve, reject) => h.Check({ service }, (e, r) => (e ? reject(e) : resolve(r))))
  assert.equal((await check('')).status, 'SERVING')
  assert.equal((await check('dsh.tools.v1.ToolHost')).status, 'SERVING')
  await assert.rejects(check('nope'), (e) => e.code === grpc.status.NOT_FOUND)
  h.close()
})

class Policy extends Interceptor {
  async preExecute(ex) {
    return ex.arguments.includes('rm -rf') ? deny('destructive command') : allow()
  }
  async postExecute(_ex, result) {
    return result.content.some((b) => b.text?.text.includes('secret')) ? block([{ type: 'text', text: 'redacted' }]) : undefined
  }
}

test('interceptor', async () => {
  const s = new Server({ interceptor: new Policy() })
  const addr = await s.listen('127.0.0.1:0')
  const c = new protos.tools.ToolInterceptor(addr, grpc.credentials.createInsecure())
  const call = (m, req) => new Promise((resolve, reject) => c[m](req, (e, r) => (e ? reject(e) : resolve(r))))
  assert.equal((await call('PreExecute', exec('bash', { command: 'rm -rf /' }))).decision.deny.reason, 'destructive command')
  assert.ok((await call('PreExecute', exec('bash', { command: 'ls' }))).decision.allow)
  const res = { content: [{ text: { text: 'the secret' } }] }
  assert.equal((await call('PostExecute', { ...exec('bash', {}), result: res })).decision.block.feedback[0].text.text, 'redacted')
  assert.equal((await call('PostExecute', { ...exec('bash', {}), result: { content: [{ text: { text: 'ok' } }] } })).decision, null)
  c.close()
  await s.stop(500)
})

test('serve: prints its address and stops on SIGTERM', async () => {
  const p = spawn(process.execPath, [path.join(here, '..', 'examples', 'jsonhost.js')], { stdio: ['ignore', 'pipe', 'pipe'] })
  try {
    const [chunk] = await once(p.stdout, 'data')
    const m = /^dsh-toolhost listening on (127\.0\.0\.1:\d+)\n/.exec(chunk.toString())
    assert.ok(m, chunk.toString())
    const c = new protos.tools.ToolHost(m[1], grpc.credentials.createInsecure())
    const r = await new Promise((resolve, reject) => c.ListTools({}, (e, x) => (e ? reject(e) : resolve(x))))
    assert.deepEqual(r.tools.map((t) => t.schema.name).sort(), ['json_query', 'json_stats'])
    c.close()
    p.kill('SIGTERM')
    const [code] = await once(p, 'exit')
    assert.equal(code, 0)
  } finally {
    p.kill('SIGKILL')
  }
})

test('GetWorkspaceContext: empty without a workspace, the hook answers otherwise', async () => {
  assert.equal((await unary('GetWorkspaceContext', { cwd: '/w' })).ownsWorkspace, false)
  await assert.rejects(unary('GetWorkspaceContext', { cwd: 'rel' }), (e) => e.code === grpc.status.INVALID_ARGUMENT)
  const seen = []
  const owning = new Server({ host: new ToolHost([], { workspaceContext: async (cwd, root) => (seen.push(root ? `${cwd} in ${root}` : cwd), { ownsWorkspace: true, projectRoot: cwd }) }) })
  const addr = await owning.listen('127.0.0.1:0')
  const c = new protos.tools.ToolHost(addr, grpc.credentials.createInsecure())
  try {
    const ask = (req) => new Promise((resolve, reject) => c.GetWorkspaceContext(req, (e, x) => (e ? reject(e) : resolve(x))))
    const r = await ask({ cwd: '/w/./a/' })
    assert.deepEqual([r.ownsWorkspace, r.projectRoot, seen], [true, '/w/a', ['/w/a']])
    // The hook gets the session root (cleaned); a relative one is refused.
    await ask({ cwd: '/w/a/sub', workspaceRoot: '/w/./a/' })
    assert.deepEqual(seen, ['/w/a', '/w/a/sub in /w/a'])
    await assert.rejects(ask({ cwd: '/w/a', workspaceRoot: 'rel' }), (e) => e.code === grpc.status.INVALID_ARGUMENT)
    // A hook whose second parameter has a default keeps getting the cwd only.
    const optsSeen = []
    const withOpts = new Server({ host: new ToolHost([], { workspaceContext: async (cwd, opts = { defaulted: true }) => (optsSeen.push(opts), { ownsWorkspace: true }) }) })
    const addr2 = await withOpts.listen('127.0.0.1:0')
    const c2 = new protos.tools.ToolHost(addr2, grpc.credentials.createInsecure())
    try {
      await new Promise((resolve, reject) => c2.GetWorkspaceContext({ cwd: '/w/a', workspaceRoot: '/w/a' }, (e, x) => (e ? reject(e) : resolve(x))))
      assert.deepEqual(optsSeen, [{ defaulted: true }])
    } finally {
      c2.close()
      await withOpts.stop(200)
    }
  } finally {
    c.close()
    await owning.stop(200)
  }
})
