// serve() reads DSH_INSECURE as strictly as the Go servers read a boolean
// variable (internal/cmdline Env.Bool): 1/t/true/yes/on, 0/f/false/no/off
// (any case; surrounding space is not trimmed, as in Go), unset or empty gives the default,
// and anything else is refused, naming the variable, the value and the
// accepted forms, before anything listens.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import net from 'node:net'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
// Namespace imports: a name the module lacks is undefined here, not a link error.
import * as sdk from '../src/index.js'
import * as hostmod from '../src/host.js'

const here = path.dirname(fileURLToPath(import.meta.url))
const TRUE_FORMS = ['1', 't', 'T', 'true', 'TRUE', 'True', 'yes', 'YeS', 'on', 'On']
const FALSE_FORMS = ['0', 'f', 'F', 'false', 'FALSE', 'False', 'no', 'NO', 'off', 'oFF']
const EMPTY_FORMS = [undefined, ''] // undefined: unset
const MALFORMED = ['ture', '2', 'enabled', 'maybe', '-1', 'yes please', 'truee', 'y', 'n', 'nope', 'é', ' on ', '\tTRUE\n', '  1', ' off ', '0  ', '   ']
const ACCEPTED = 'not a boolean (true or false; also 1 or 0, yes or no, on or off)'

const ping = sdk.defineTool({ name: 'ping', execute: async () => 'pong' })

/** Run fn with process.env.DSH_INSECURE = value (undefined: unset), restored afterwards. */
async function withInsecure(value, fn) {
  const had = Object.hasOwn(process.env, 'DSH_INSECURE')
  const old = process.env.DSH_INSECURE
  if (value === undefined) delete process.env.DSH_INSECURE
  else process.env.DSH_INSECURE = value
  try {
    return await fn()
  } finally {
    if (had) process.env.DSH_INSECURE = old
    else delete process.env.DSH_INSECURE
  }
}

/**
 * serve() with DSH_INSECURE = value: {srv} (stopped, its signal handlers
 * removed, its "listening" line kept off the test output) or {err}.
 */
async function serveWith(value, opts) {
  const signals = { SIGTERM: process.listeners('SIGTERM'), SIGINT: process.listeners('SIGINT') }
  const write = process.stdout.write
  process.stdout.write = function (chunk, ...rest) {
    return String(chunk).startsWith('dsh-toolhost listening on ') ? true : write.call(this, chunk, ...rest)
  }
  let r
  try {
    r = await withInsecure(value, () => sdk.serve([ping], opts).then((srv) => ({ srv }), (err) => ({ err })))
  } finally {
    process.stdout.write = write
  }
  if (r.srv) await r.srv.stop(0)
  for (const [sig, before] of Object.entries(signals)) {
    for (const l of process.listeners(sig)) if (!before.includes(l)) process.removeListener(sig, l)
  }
  return r
}

/** A loopback port free now. */
async function freePort() {
  const s = net.createServer()
  await new Promise((resolve) => s.listen(0, '127.0.0.1', resolve))
  const { port } = s.address()
  await new Promise((resolve) => s.close(resolve))
  return port
}

test('envBool: true, false and empty forms', () => {
  const cases = [
    ...TRUE_FORMS.flatMap((v) => [[v, false, true], [v, true, true]]),
    ...FALSE_FORMS.flatMap((v) => [[v, false, false], [v, true, false]]),
    ...EMPTY_FORMS.flatMap((v) => [[v, false, false], [v, true, true]]),
  ]
  for (const [value, def, want] of cases) {
    const env = value === undefined ? {} : { DSH_INSECURE: value }
    assert.equal(hostmod.envBool(env, 'DSH_INSECURE', def), want, `${JSON.stringify(value)} (default ${def})`)
  }
})

test('envBool: a malformed value throws naming the variable, the value, the forms and the default', () => {
  for (const value of MALFORMED) {
    for (const def of [false, true]) {
      assert.throws(() => hostmod.envBool({ DSH_INSECURE: value }, 'DSH_INSECURE', def), (e) => {
        assert.ok(e instanceof sdk.EnvError, `${e}`)
        assert.equal(e.name, 'EnvError')
        assert.deepEqual([e.variable, e.value], ['DSH_INSECURE', value])
        assert.equal(e.message, `DSH_INSECURE=${JSON.stringify(value)}: ${ACCEPTED}; unset means ${def}`)
        return true
      }, JSON.stringify(value))
    }
  }
})

test('serve: DSH_INSECURE in any case, empty is false', async () => {
  const cases = [...TRUE_FORMS.map((v) => [v, true]), ...FALSE_FORMS.map((v) => [v, false]), ...EMPTY_FORMS.map((v) => [v, false])]
  for (const [value, want] of cases) {
    const r = await serveWith(value, { address: '127.0.0.1:0' })
    assert.ifError(r.err)
    assert.equal(r.srv.insecure, want, JSON.stringify(value))
  }
})

test('serve: the insecure option wins over a well-formed DSH_INSECURE', async () => {
  for (const [value, insecure] of [['1', false], ['off', true]]) {
    const r = await serveWith(value, { address: '127.0.0.1:0', insecure })
    assert.ifError(r.err)
    assert.equal(r.srv.insecure, insecure)
  }
})

test('serve: a malformed DSH_INSECURE rejects naming it before it listens', async () => {
  for (const value of MALFORMED) {
    // With the option too: the operator set the variable wrong, as the Go servers refuse it under its flag.
    for (const opts of [{}, { insecure: true }, { insecure: false }]) {
      const port = await freePort()
      const r = await serveWith(value, { address: `127.0.0.1:${port}`, ...opts })
      const what = `${JSON.stringify(value)} ${JSON.stringify(opts)}`
      assert.ok(!r.srv, `serve() listened on ${r.srv?.address}: ${what}`)
      assert.ok(r.err instanceof sdk.EnvError, `${r.err}: ${what}`)
      assert.ok(r.err.message.startsWith(`DSH_INSECURE=${JSON.stringify(value)}: ${ACCEPTED}`), r.err.message)
    }
  }
})

test('a toolhost process with a malformed DSH_INSECURE exits naming it', async () => {
  const port = await freePort()
  const code = `import { serve } from ${JSON.stringify(path.join(here, '..', 'src', 'index.js'))}
await serve([])`
  const env = { ...process.env, DSH_INSECURE: 'ture', DSH_LISTEN: `127.0.0.1:${port}` }
  for (const k of ['DSH_TLS_CERT', 'DSH_TLS_KEY', 'DSH_TLS_CLIENT_CA', 'DSH_ALLOW_PEER']) delete env[k]
  // The old reading (malformed = false) listened on loopback until killed.
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], { env, encoding: 'utf8', timeout: 20000, killSignal: 'SIGKILL' })
  assert.notEqual(r.status, 0, r.stderr)
  assert.doesNotMatch(r.stdout, /listening/)
  assert.ok(r.stderr.includes(`DSH_INSECURE="ture": ${ACCEPTED}; unset means false`), r.stderr)
})
