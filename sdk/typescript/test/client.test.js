import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as grpc from '@grpc/grpc-js'
import { AgentClient, ApprovalDecision, grpcDefinition } from '../src/client.js'
import { AgentService, AgentStatus } from '../gen/dsh/agent/v1/agent_pb.js'

// A fake AgentService (the client's upstream) that records requests and tokens.
async function fakeAgent() {
  const seen = []
  const record = (call) => seen.push({ req: call.request, auth: call.metadata.get('authorization')[0] })
  const server = new grpc.Server()
  let cancelled
  const gone = new Promise((resolve) => (cancelled = resolve))
  server.addService(grpcDefinition(AgentService), {
    CreateSession: (call, cb) => { record(call); cb(null, { session: { header: { id: 's-1', cwd: call.request.cwd } } }) },
    Send: (call, cb) => { record(call); cb(null, { status: AgentStatus.RUNNING }) },
    Respond: (call, cb) => { record(call); cb(null, { seq: 42n }) },
    WaitIdle: (call, cb) => { record(call); cb(null, { session: { status: AgentStatus.IDLE } }) },
    StreamEvents: (call) => {
      record(call)
      call.write({ event: { seq: 7n, payload: { case: 'turnEnd', value: { turn: 1 } } } })
      call.write({ progress: { toolName: 'bash', afterSeq: 7n } })
      call.on('cancelled', cancelled) // follows until the client cancels
    },
  })
  const port = await new Promise((resolve, reject) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))))
  return { seen, gone, addr: `127.0.0.1:${port}`, stop: () => server.forceShutdown() }
}

test('client calls carry the right requests and the token', async () => {
  const fake = await fakeAgent()
  const c = new AgentClient(fake.addr, { token: 't0k' })
  try {
    const s = await c.createSession({ cwd: '/w', provider: 'scripted', model: 'm1' })
    assert.equal(s.header.id, 's-1')
    assert.equal((await c.send('s-1', 'hi')).status, AgentStatus.RUNNING)
    assert.equal(await c.respond('s-1', 'ap-1', { decision: ApprovalDecision.ALLOW_FOR_SESSION, message: 'ok' }), 42n)
    await c.respond('s-1', 'q-1', { answers: [{ id: 'q1', selected: ['yes'] }] })
    assert.equal((await c.waitIdle('s-1')).status, AgentStatus.IDLE)
    const [create, send, approval, question, idle] = fake.seen.map((x) => x.req)
    assert.deepEqual([create.cwd, create.options.provider, create.options.model], ['/w', 'scripted', 'm1'])
    assert.deepEqual(send.content.map((b) => b.block.value.text), ['hi'])
    assert.deepEqual([approval.answer.case, approval.answer.value.decision, approval.answer.value.message], ['approval', ApprovalDecision.ALLOW_FOR_SESSION, 'ok'])
    assert.deepEqual([question.answer.case, question.answer.value.answers[0].selected], ['question', ['yes']])
    assert.equal(idle.sessionId, 's-1')
    assert.deepEqual(fake.seen.map((x) => x.auth), Array(5).fill('Bearer t0k'))
  } finally {
    c.close()
    fake.stop()
  }
})

test('streamEvents follows until cancelled, then ends quietly', async () => {
  const fake = await fakeAgent()
  const c = new AgentClient(fake.addr)
  try {
    const events = c.streamEvents('s-1', { fromSeq: 3, includeProgress: true })
    const got = []
    for await (const resp of events) {
      got.push(resp.progress ? `progress ${resp.progress.toolName}` : `${resp.event.seq} ${resp.event.payload.case}`)
      if (got.length === 2) events.cancel()
    }
    assert.deepEqual(got, ['7 turnEnd', 'progress bash'])
    await fake.gone
    const req = fake.seen[0].req
    assert.deepEqual([req.sessionId, req.fromSeq, req.noFollow, req.includeProgress], ['s-1', 3n, false, true])
  } finally {
    c.close()
    fake.stop()
  }
})
