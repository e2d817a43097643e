import { test } from 'node:test'
import assert from 'node:assert/strict'
import { specToJsonSchema, validateArgs, defineTool } from '../src/index.js'

const SPEC = {
  name: { type: 'string', required: true, description: 'The name.' },
  count: { type: 'number' },
  n: { type: 'integer' },
  on: { type: 'boolean' },
  mode: { type: 'string', enum: ['plain', 'upper'] },
  tags: { type: 'array', items: { type: 'string' } },
  opts: { type: 'object', properties: { flag: { type: 'boolean', required: true } } },
  free: { type: 'object' },
  list: { type: 'array' },
}

test('specToJsonSchema', () => {
  assert.deepEqual(specToJsonSchema(SPEC), {
    type: 'object',
    properties: {
      name: { type: 'string', description: 'The name.' },
      count: { type: 'number' },
      n: { type: 'integer' },
      on: { type: 'boolean' },
      mode: { type: 'string', enum: ['plain', 'upper'] },
      tags: { type: 'array', items: { type: 'string' } },
      opts: { type: 'object', properties: { flag: { type: 'boolean' } }, required: ['flag'] },
      free: { type: 'object' },
      list: { type: 'array' },
    },
    required: ['name'],
  })
  assert.deepEqual(specToJsonSchema({ a: { type: 'string', description: '', default: 'x' } }), { type: 'object', properties: { a: { type: 'string', default: 'x' } } })
  assert.throws(() => specToJsonSchema({ a: { type: 'date' } }), /needs a type/)
  assert.throws(() => defineTool({ name: 't', execute() {}, timeoutMs: -1 }), /timeoutMs/)
  assert.throws(() => defineTool({ name: 't', execute() {}, timeoutMs: Infinity }), /timeoutMs/)
})

test('validateArgs', async (t) => {
  const cases = [
    ['valid minimal', { name: 'x' }, []],
    ['extra keys allowed', { name: 'x', zzz: 1 }, []],
    ['not an object', [1], ['"arguments" must be an object']],
    ['null top', null, ['"arguments" must be an object']],
    ['missing required', {}, ['missing required property "name"']],
    ['required null', { name: null }, ['"name" must be a string']],
    ['optional null is absent', { name: 'x', count: null }, []],
    ['wrong string', { name: 1 }, ['"name" must be a string']],
    ['bool is not a number', { name: 'x', count: true }, ['"count" must be a number']],
    ['integer', { name: 'x', n: 1.5 }, ['"n" must be an integer']],
    ['integral float is an integer', { name: 'x', n: 2.0 }, []],
    ['boolean', { name: 'x', on: 'yes' }, ['"on" must be a boolean']],
    ['enum', { name: 'x', mode: 'loud' }, ['"mode" must be one of [plain, upper]']],
    ['enum type first', { name: 'x', mode: 3 }, ['"mode" must be a string']],
    ['array items', { name: 'x', tags: ['a', 2, null] }, ['"tags[1]" must be a string', '"tags[2]" must be a string']],
    ['array type', { name: 'x', tags: 'a' }, ['"tags" must be an array']],
    ['nested missing', { name: 'x', opts: {} }, ['missing required property "opts.flag"']],
    ['nested type', { name: 'x', opts: { flag: 1 } }, ['"opts.flag" must be a boolean']],
    ['object type-only', { name: 'x', free: { anything: [1] } }, []],
    ['object wrong', { name: 'x', free: [] }, ['"free" must be an object']],
    ['array untyped', { name: 'x', list: [1, 'a'] }, []],
    ['declaration order', { opts: {}, name: 2, mode: 'q' }, ['"name" must be a string', '"mode" must be one of [plain, upper]', 'missing required property "opts.flag"']],
  ]
  for (const [name, args, want] of cases) {
    await t.test(name, () => assert.deepEqual(validateArgs(SPEC, args), want))
  }
})
