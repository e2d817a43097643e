import { test } from 'node:test'
import assert from 'node:assert/strict'
import { defineTool, rawTool, runCall, descriptor } from '../src/index.js'
import { executionMode, callView } from '../src/tool.js'

const run = (t, args, signal = new AbortController().signal, outs = []) =>
  runCall(t, { callId: 'c', name: t.name, arguments: typeof args === 'string' ? args : JSON.stringify(args) }, { signal, emit: (s, x) => outs.push([s, x]) })
const textOf = (r) => r.content.map((b) => b.text?.text ?? '').join('')

test('per-call classifier', () => {
  const read = defineTool({
    name: 'read',
    parameters: { path: { type: 'string', required: true }, write: { type: 'boolean' } },
    isConcurrencySafe: (a) => !a.write,
    execute: () => '',
  })
  assert.equal(descriptor(read).concurrency, 'CONCURRENCY_SAFETY_PER_CALL')
  assert.equal(executionMode(read, { path: 'a' }), 'EXECUTION_MODE_PARALLEL')
  assert.equal(executionMode(read, { path: 'a', write: true }), 'EXECUTION_MODE_EXCLUSIVE')
  assert.equal(executionMode(read, {}), 'EXECUTION_MODE_EXCLUSIVE')
  const boom = defineTool({ name: 'b', isConcurrencySafe: () => { throw new Error('bug') }, execute: () => '' })
  assert.equal(executionMode(boom, {}), 'EXECUTION_MODE_EXCLUSIVE')
  const truthy = defineTool({ name: 't', isConcurrencySafe: () => 1, execute: () => '' })
  assert.equal(executionMode(truthy, {}), 'EXECUTION_MODE_EXCLUSIVE', 'only an exact true is parallel')
})

test('presenters are soft', () => {
  const t = defineTool({ name: 'p', parameters: { a: { type: 'string', required: true } }, execute: () => '', presentCall: (a) => ({ card: 'generic', title: a.a.toUpperCase() }) })
  assert.deepEqual(callView(t, { a: 'x' }).generic.title, 'X')
  assert.equal(callView(t, {}), undefined)
  const bad = defineTool({ name: 'q', execute: () => '', presentCall: () => ({ card: 'nope' }) })
  assert.equal(callView(bad, {}), undefined)
})

test('generator stops when the signal aborts', async () => {
  const ac = new AbortController()
  let closed = false
  const t = defineTool({
    name: 'g',
    async *execute() {
      try {
        yield 'one'
        ac.abort()
        yield 'two'
        yield 'three'
      } finally {
        closed = true
      }
    },
  })
  const outs = []
  const r = await run(t, {}, ac.signal, outs)
  assert.deepEqual(outs, [['stdout', 'one'], ['stdout', 'two']])
  assert.ok(closed)
  assert.equal(r.isError, true)
  assert.equal(r.error.code, 'ABORTED')
})

test('return shapes', async () => {
  const cases = [
    ['string', 'hi', 'hi', false],
    ['blocks', [{ type: 'text', text: 'a' }, 'b'], 'ab', false],
    ['object with content', { content: 'x', meta: { n: 1 } }, 'x', false],
    ['json value', { a: 1 }, '{"a":1}', false],
    ['undefined', undefined, '', false],
    ['bigint meta', { content: 'x', meta: { n: 1n } }, null, true],
  ]
  for (const [name, value, want, isError] of cases) {
    const r = await run(defineTool({ name: 'r', execute: () => value }), {})
    assert.equal(r.isError, isError, name)
    if (want !== null) assert.equal(textOf(r), want, name)
  }
})

test('definition errors', () => {
  assert.throws(() => rawTool({ name: 'r', parameters: { type: 'array' }, execute: () => '' }), /JSON Schema object/)
  assert.throws(() => defineTool({ name: '', execute: () => '' }), /needs a name/)
  assert.throws(() => defineTool({ name: 'x' }), /execute must be a function/)
  assert.throws(() => defineTool({ name: 'x', concurrency: 'sometimes', execute: () => '' }), /concurrency/)
})
