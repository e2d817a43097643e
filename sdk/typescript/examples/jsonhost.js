#!/usr/bin/env node
// An example dsh toolhost in JavaScript with two JSON tools.
//
//   node sdk/typescript/examples/jsonhost.js [--listen 127.0.0.1:7711] [--conformance]
//
// json_query selects values from a JSON document (inline or a file) with a
// small path language: `.a.b`, `[0]`, `[*]` (every element or value), `["k"]`.
// json_stats reports the shape of a document (depth, counts per JSON type).
// File paths resolve against the session's cwd and must stay inside the
// workspace root when the agent sends one. --conformance also serves the tools
// of the cross-language conformance suite (tests/conformance).

import fs from 'node:fs/promises'
import path from 'node:path'
import { parseArgs } from 'node:util'
import { defineTool, serve, ToolError, ToolHost } from '../src/index.js'
import { conformanceTools } from '../src/conformance.js'

/** Parse a query into steps: {key} | {index} | {all: true}. */
export function parseQuery(q) {
  const steps = []
  let i = 0
  const s = q.trim()
  if (s === '' || s === '.') return steps
  while (i < s.length) {
    if (s[i] === '.') {
      const m = /^[A-Za-z_$][\w$-]*/.exec(s.slice(i + 1))
      if (!m) throw new ToolError(`bad query at offset ${i}: expected a name after "."`, 'BAD_QUERY')
      steps.push({ key: m[0] })
      i += 1 + m[0].length
    } else if (s[i] === '[') {
      const end = s.indexOf(']', i)
      if (end < 0) throw new ToolError(`bad query at offset ${i}: unclosed "["`, 'BAD_QUERY')
      const inner = s.slice(i + 1, end).trim()
      if (inner === '*') steps.push({ all: true })
      else if (/^-?\d+$/.test(inner)) steps.push({ index: Number(inner) })
      else if (/^".*"$/.test(inner)) steps.push({ key: JSON.parse(inner) })
      else throw new ToolError(`bad query at offset ${i}: expected an index, * or a quoted key`, 'BAD_QUERY')
      i = end + 1
    } else if (i === 0) {
      const m = /^[A-Za-z_$][\w$-]*/.exec(s)
      if (!m) throw new ToolError(`bad query at offset 0: unexpected ${JSON.stringify(s[0])}`, 'BAD_QUERY')
      steps.push({ key: m[0] })
      i = m[0].length
    } else {
      throw new ToolError(`bad query at offset ${i}: unexpected ${JSON.stringify(s[i])}`, 'BAD_QUERY')
    }
  }
  return steps
}

/** Apply steps to a value; returns every match. */
export function query(value, steps) {
  let cur = [value]
  for (const st of steps) {
    const next = []
    for (const v of cur) {
      if (st.all) {
        if (Array.isArray(v)) next.push(...v)
        else if (v && typeof v === 'object') next.push(...Object.values(v))
      } else if (st.index !== undefined) {
        if (Array.isArray(v)) {
          const k = st.index < 0 ? v.length + st.index : st.index
          if (k >= 0 && k < v.length) next.push(v[k])
        }
      } else if (v && typeof v === 'object' && !Array.isArray(v) && Object.hasOwn(v, st.key)) {
        next.push(v[st.key])
      }
    }
    cur = next
  }
  return cur
}

async function load(args, ctx) {
  if ((args.json === undefined) === (args.path === undefined)) throw new ToolError('give exactly one of json or path', 'INVALID_ARGS', 'ToolArgsError')
  let src = args.json
  if (args.path !== undefined) {
    const full = path.resolve(ctx.cwd || process.cwd(), args.path)
    if (ctx.workspaceRoot) {
      const root = path.resolve(ctx.workspaceRoot)
      if (full !== root && !full.startsWith(root + path.sep)) throw new ToolError(`${args.path} is outside the workspace`, 'FS_PERMISSION_DENIED')
    }
    try {
      src = await fs.readFile(full, { encoding: 'utf8', signal: ctx.signal })
    } catch (e) {
      if (e.code === 'ENOENT') throw new ToolError(`${args.path}: no such file`, 'FS_NOT_FOUND')
      throw e
    }
  }
  try {
    return JSON.parse(src)
  } catch (e) {
    throw new ToolError(`the document is not valid JSON: ${e.message}`, 'BAD_JSON')
  }
}

const source = {
  json: { type: 'string', description: 'The JSON document, inline.' },
  path: { type: 'string', description: "A JSON file, relative to the session's working directory." },
}

export const jsonQuery = defineTool({
  name: 'json_query',
  description: 'Select values from a JSON document with a path such as .items[*].name, .a["odd key"][0]. Give the document inline (json) or as a file (path).',
  concurrency: 'always',
  parameters: {
    query: { type: 'string', required: true, description: 'The path expression; "." is the whole document.' },
    ...source,
    limit: { type: 'integer', description: 'At most this many matches.', default: 100 },
  },
  async execute(args, ctx) {
    const steps = parseQuery(args.query)
    const doc = await load(args, ctx)
    const all = query(doc, steps)
    const limit = args.limit ?? 100
    const shown = all.slice(0, limit)
    const lines = shown.map((v) => JSON.stringify(v))
    if (all.length > shown.length) lines.push(`... ${all.length - shown.length} more matches`)
    return { content: [{ type: 'text', text: all.length === 0 ? 'no matches' : lines.join('\n') }], meta: { matches: all.length } }
  },
  presentCall: (args) => ({ card: 'generic', title: `Query ${args.path ?? 'JSON'}: ${args.query}`, kind: 'search', rawInput: args.query, locations: args.path ? [{ path: args.path }] : [] }),
  presentResult: (_args, result) => (result.isError || !result.meta ? undefined : { card: 'generic', title: `${result.meta.matches} matches` }),
})

export const jsonStats = defineTool({
  name: 'json_stats',
  description: 'Describe the shape of a JSON document: depth and how many values of each JSON type it holds.',
  concurrency: 'always',
  parameters: { ...source },
  async execute(args, ctx) {
    const doc = await load(args, ctx)
    const counts = { object: 0, array: 0, string: 0, number: 0, boolean: 0, null: 0 }
    let depth = 0
    const walk = (v, d) => {
      depth = Math.max(depth, d)
      if (v === null) counts.null++
      else if (Array.isArray(v)) {
        counts.array++
        v.forEach((x) => walk(x, d + 1))
      } else if (typeof v === 'object') {
        counts.object++
        Object.values(v).forEach((x) => walk(x, d + 1))
      } else counts[typeof v]++
    }
    walk(doc, 1)
    const parts = Object.entries(counts).filter(([, n]) => n > 0).map(([k, n]) => `${n} ${k}`)
    return { content: [{ type: 'text', text: `depth ${depth}; ${parts.join(', ')}` }], meta: { depth, counts } }
  },
})

async function main() {
  const { values } = parseArgs({ options: { listen: { type: 'string' }, conformance: { type: 'boolean', default: false } } })
  const host = new ToolHost([jsonQuery, jsonStats])
  if (values.conformance) for (const t of conformanceTools(host)) host.add(t)
  await serve([], { host, address: values.listen })
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('jsonhost.js')) {
  main().catch((e) => {
    console.error(e)
    process.exit(1)
  })
}
