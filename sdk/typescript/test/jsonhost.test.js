import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { runCall } from '../src/index.js'
import { jsonQuery, jsonStats, parseQuery } from '../examples/jsonhost.js'

const call = (t, args, ctx = {}) => runCall(t, { callId: 'c', name: t.name, arguments: JSON.stringify(args), context: ctx }, { signal: new AbortController().signal, emit: () => {} })
const textOf = (r) => r.content.map((b) => b.text?.text ?? '').join('')

test('parseQuery', () => {
  assert.deepEqual(parseQuery('.items[*].name'), [{ key: 'items' }, { all: true }, { key: 'name' }])
  assert.deepEqual(parseQuery('a["odd key"][-1]'), [{ key: 'a' }, { key: 'odd key' }, { index: -1 }])
  assert.deepEqual(parseQuery('.'), [])
  assert.throws(() => parseQuery('.a[x]'), /bad query at offset 2/)
})

test('json_query', async (t) => {
  const doc = JSON.stringify({ items: [{ name: 'a', n: 1 }, { name: 'b', n: 2 }, { n: 3 }], 'odd key': [true] })
  const cases = [
    ['wildcard', { json: doc, query: '.items[*].name' }, '"a"\n"b"', false],
    ['index', { json: doc, query: '.items[-1]' }, '{"n":3}', false],
    ['quoted key', { json: doc, query: '["odd key"][0]' }, 'true', false],
    ['limit', { json: doc, query: '.items[*].n', limit: 1 }, '1\n... 2 more matches', false],
    ['no matches', { json: doc, query: '.nope' }, 'no matches', false],
    ['bad json', { json: '{', query: '.' }, null, true],
    ['neither source', { query: '.' }, 'Error: give exactly one of json or path', true],
    ['invalid', { json: doc }, 'Error: invalid arguments: missing required property "query"', true],
  ]
  for (const [name, args, want, isError] of cases) {
    await t.test(name, async () => {
      const r = await call(jsonQuery, args)
      if (want !== null) assert.equal(textOf(r), want)
      assert.equal(r.isError, isError)
    })
  }
  const r = await call(jsonQuery, { json: doc, query: '.items[*]' })
  assert.equal(r.view.generic.title, '3 matches')
})

test('json files are confined to the workspace', async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'jsonhost-'))
  await fs.writeFile(path.join(dir, 'd.json'), '{"a":[1,"x",null,{"b":false}]}')
  const ctx = { cwd: dir, workspaceRoot: dir }
  assert.equal(textOf(await call(jsonStats, { path: 'd.json' }, ctx)), 'depth 4; 2 object, 1 array, 1 string, 1 number, 1 boolean, 1 null')
  const esc = await call(jsonQuery, { path: '../x.json', query: '.' }, ctx)
  assert.equal(esc.error.code, 'FS_PERMISSION_DENIED')
  const missing = await call(jsonQuery, { path: 'no.json', query: '.' }, ctx)
  assert.equal(textOf(missing), 'Error: no.json: no such file')
})
