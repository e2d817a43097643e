// TLS, mTLS and peer authorization of Server/serve(), attacked like an
// intruder would: no certificate, a certificate of another CA, the right CA
// with the wrong identity, plaintext, a non-loopback plaintext listen.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import * as grpc from '@grpc/grpc-js'
import { defineTool, ToolHost, Server, TLSConfigError, loadProtos } from '../src/index.js'
import { CA } from './pki.js'

const here = path.dirname(fileURLToPath(import.meta.url))
const protos = loadProtos()
const AGENT = 'spiffe://dsh/agent'
const ping = defineTool({ name: 'ping', execute: async () => 'pong' })

let ca, other, agent, byDns, intruder, foreign, srv, addr, certFile, keyFile
before(async () => {
  ca = new CA('dsh')
  other = new CA('other')
  const s = ca.server('toolhost', { uris: ['spiffe://dsh/toolhost'] })
  agent = ca.client('agent', { uris: [AGENT] })
  byDns = ca.client('by-dns', { dns: ['agent.dsh.svc'] })
  intruder = ca.client('intruder', { uris: ['spiffe://dsh/intruder'] })
  foreign = other.client('foreign', { uris: [AGENT] })
  certFile = path.join(ca.dir, 'tls.crt')
  keyFile = path.join(ca.dir, 'tls.key')
  fs.copyFileSync(s.certFile, certFile)
  fs.copyFileSync(s.keyFile, keyFile)
  srv = new Server({ host: new ToolHost([ping]), tlsCert: certFile, tlsKey: keyFile, tlsClientCa: ca.certFile, allowPeers: [AGENT, 'agent.dsh.svc'], refreshIntervalMs: 100 })
  const bound = await srv.listen('127.0.0.1:0')
  addr = `localhost:${bound.split(':').at(-1)}`
})
after(async () => {
  await srv.stop(0)
  ca.cleanup()
  other.cleanup()
})

function client(leaf, trust = ca) {
  const creds = grpc.credentials.createSsl(trust.certPem, leaf?.keyPem ?? null, leaf?.certPem ?? null)
  return new protos.tools.ToolHost(addr, creds)
}

function listTools(c) {
  return new Promise((resolve, reject) => c.ListTools({}, { deadline: Date.now() + 10000 }, (e, r) => (e ? reject(e) : resolve(r))))
}

async function expectCode(code, p) {
  await assert.rejects(p, (e) => {
    assert.equal(e.code, code, e.details)
    return true
  })
}

test('the agent certificate is served', async () => {
  const c = client(agent)
  const r = await listTools(c)
  assert.deepEqual(r.tools.map((t) => t.schema.name), ['ping'])
  c.close()
})

test('a DNS SAN is an identity too', async () => {
  const c = client(byDns)
  assert.equal((await listTools(c)).tools.length, 1)
  c.close()
})

test('a wrong identity is PERMISSION_DENIED on every RPC', async () => {
  const c = client(intruder)
  await expectCode(grpc.status.PERMISSION_DENIED, listTools(c))
  const exec = new Promise((resolve, reject) => {
    const s = c.Execute({ execution: { callId: 'c', name: 'ping', arguments: '{}', context: { sessionId: 's', cwd: '/tmp' } } })
    s.on('data', () => reject(new Error('a tool ran for an intruder')))
    s.on('error', reject)
    s.on('end', resolve)
  })
  await expectCode(grpc.status.PERMISSION_DENIED, exec)
  const h = new protos.health.Health(addr, grpc.credentials.createSsl(ca.certPem, intruder.keyPem, intruder.certPem))
  await expectCode(grpc.status.PERMISSION_DENIED, new Promise((resolve, reject) => h.Check({}, (e, r) => (e ? reject(e) : resolve(r)))))
  h.close()
  c.close()
})

test('no client certificate fails the handshake', async () => {
  const c = client(null)
  await expectCode(grpc.status.UNAVAILABLE, listTools(c))
  c.close()
})

test('a certificate of another CA fails the handshake', async () => {
  const c = client(foreign)
  await expectCode(grpc.status.UNAVAILABLE, listTools(c))
  c.close()
})

test('a plaintext client is refused', async () => {
  const c = new protos.tools.ToolHost(addr, grpc.credentials.createInsecure())
  await expectCode(grpc.status.UNAVAILABLE, listTools(c))
  c.close()
})

test('a rotated certificate is picked up', async () => {
  const old = client(agent)
  await listTools(old)
  const ca2 = new CA('rotated')
  const next = ca2.server('toolhost2')
  for (const [src, dst] of [[next.certFile, certFile], [next.keyFile, keyFile]]) {
    fs.copyFileSync(src, dst + '.tmp')
    fs.renameSync(dst + '.tmp', dst)
  }
  // A new connection trusting only the new CA succeeds once the files are re-read.
  const deadline = Date.now() + 10000
  for (;;) {
    const c = client(agent, ca2)
    try {
      assert.equal((await listTools(c)).tools.length, 1)
      c.close()
      break
    } catch (e) {
      c.close()
      if (Date.now() > deadline) throw e
      await new Promise((r) => setTimeout(r, 50))
    }
  }
  assert.equal((await listTools(old)).tools.length, 1, 'the established connection keeps working')
  old.close()
  ca2.cleanup()
})

test('a non-loopback listen without TLS is refused naming insecure', async () => {
  for (const a of ['0.0.0.0:0', '[::]:0']) {
    const s = new Server({ host: new ToolHost([ping]) })
    await assert.rejects(s.listen(a), (e) => e instanceof TLSConfigError && e.message.includes('insecure'))
  }
})

test('insecure starts with a warning', () => {
  const code = `import { Server, ToolHost } from ${JSON.stringify(path.join(here, '..', 'src', 'index.js'))}
const s = new Server({ host: new ToolHost(), insecure: true }); await s.listen('0.0.0.0:0'); await s.stop(0)`
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], { encoding: 'utf8', timeout: 60000 })
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stderr, /WARN.*insecure/)
})

test('bad combinations are refused', () => {
  const leaf = ca.server('s')
  const cases = {
    'cert without key': { tlsCert: leaf.certFile },
    'client ca without cert': { tlsClientCa: ca.certFile },
    'allow peers without client ca': { tlsCert: leaf.certFile, tlsKey: leaf.keyFile, allowPeers: [AGENT] },
    'missing file': { tlsCert: '/nonexistent.pem', tlsKey: leaf.keyFile },
    'not pem': { tlsCert: fileURLToPath(import.meta.url), tlsKey: leaf.keyFile },
  }
  for (const [name, opts] of Object.entries(cases)) {
    assert.throws(() => new Server({ host: new ToolHost([ping]), ...opts }), TLSConfigError, name)
  }
})
