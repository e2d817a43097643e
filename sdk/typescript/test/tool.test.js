import { test } from 'node:test'
import assert from 'node:assert/strict'
import { defineTool, rawTool, runCall, descriptor, ToolError } from '../src/index.js'
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

test('invalid JSON is worded as every dsh host words it', async () => {
  const t = defineTool({ name: 'j', parameters: { a: { type: 'number' } }, execute: () => 'ok' })
  const cases = [
    ['', 'unexpected end of JSON input'],
    ['{"a":', 'unexpected end of JSON input'],
    ['{} x', 'unexpected data after the JSON value'],
    ['{"a" 1}', "invalid character '1' after object key"],
    ['{"a":1,}', "invalid character '}' looking for beginning of object key string"],
    ['{"a":[1 2]}', "invalid character '2' after array element"],
    ['{"a":tru}', "invalid character '}' in literal true (expecting 'e')"],
    ['{"a":"\\u12g4"}', "invalid character 'g' in \\u hexadecimal character escape"],
    ['{"a":"\x01"}', "invalid character '\\x01' in string literal"],
    ['{"a":\u00e9}', "invalid character '\u00c3' looking for beginning of value"],
    ['{"a":\u0080}', "invalid character '\u00c2' looking for beginning of value"],
    ['{"a":\uffff}', "invalid character '\u00ef' looking for beginning of value"],
    ['['.repeat(10001), "invalid character '[' exceeded max depth"],
    ['['.repeat(10000), 'unexpected end of JSON input'],
  ]
  for (const [raw, want] of cases) {
    const r = await run(t, raw)
    assert.equal(textOf(r), `Error: invalid arguments: arguments are not valid JSON: ${want}`, raw.slice(0, 20))
    assert.equal(r.error.code, 'INVALID_ARGS')
  }
})

test('a throw is logged with its stack; the model gets only the message', async () => {
  function helperThatFails(x) {
    throw new RangeError(`no luck with ${x}`)
  }
  const t = defineTool({ name: 'explode', parameters: { x: { type: 'number', required: true } }, execute: (a) => helperThatFails(a.x) })
  const typed = defineTool({ name: 'typed', execute: () => { throw new ToolError('not today', 'NOPE') } })
  const lines = []
  const logger = { error: (m) => lines.push(m) }
  const ex = (tool, args) => ({ callId: 'call-7', name: tool.name, arguments: JSON.stringify(args), context: { sessionId: 's-1' } })
  const r = await runCall(t, ex(t, { x: 3 }), { signal: new AbortController().signal, emit: () => {}, logger })
  assert.equal(textOf(r), 'Error: no luck with 3')
  assert.equal(lines.length, 1)
  for (const want of ['explode', 'call-7', 's-1', 'no luck with 3', 'RangeError', 'helperThatFails']) assert.ok(lines[0].includes(want), `${want} missing from ${lines[0]}`)
  const r2 = await runCall(typed, ex(typed, {}), { signal: new AbortController().signal, emit: () => {}, logger })
  assert.equal(textOf(r2), 'Error: not today')
  assert.equal(lines.length, 1, 'a ToolError is a result, not a host failure')
})
