// The conformance tools every dsh toolhost example exposes, so that one
// language-neutral suite (tests/conformance, in Go) can check any host. The
// tool set and its exact behaviour are specified in
// tests/conformance/conformance.go; keep the two in step.

import { defineTool, ToolError } from './tool.js'

/** Build the conformance tools; conf_add_tool adds tools to `host`. */
export function conformanceTools(host) {
  const status = new Map()
  const barriers = new Map() // key -> {count, waiters: [resolve]}

  const confEcho = defineTool({
    name: 'conf_echo',
    description: 'Echo text back.',
    concurrency: 'always',
    parameters: {
      text: { type: 'string', required: true, description: 'Text to echo back.' },
      mode: { type: 'string', enum: ['plain', 'upper'], description: 'How to echo.' },
      tags: { type: 'array', items: { type: 'string' }, description: 'Free-form tags.' },
      opts: { type: 'object', description: 'Nested options.', properties: { flag: { type: 'boolean', required: true, description: 'A required flag.' } } },
    },
    execute: async (args) => ({ content: [{ type: 'text', text: args.mode === 'upper' ? args.text.toUpperCase() : args.text }], meta: { length: [...args.text].length } }),
    presentCall: (args) => ({ card: 'generic', title: `echo ${args.text}`, kind: 'other', rawInput: args.text }),
    presentResult: (args) => ({ card: 'generic', title: `echoed ${args.text}` }),
  })

  const confFail = defineTool({
    name: 'conf_fail',
    description: 'Fail with the given message.',
    parameters: { message: { type: 'string', required: true, description: 'The error message.' } },
    execute: async (args) => {
      throw new Error(args.message)
    },
  })

  const confSlow = defineTool({
    name: 'conf_slow',
    description: 'Sleep until cancelled or ms elapse, recording the outcome under key.',
    parameters: {
      key: { type: 'string', required: true, description: 'Where conf_status finds the outcome.' },
      ms: { type: 'integer', description: 'How long to sleep.', default: 60000 },
    },
    execute: (args, ctx) => {
      status.set(args.key, 'running')
      ctx.emit(`started ${args.key}`)
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          status.set(args.key, 'completed')
          resolve(`slept ${args.key}`)
        }, args.ms ?? 60000)
        ctx.signal.addEventListener('abort', () => {
          clearTimeout(timer)
          status.set(args.key, 'cancelled')
          reject(new ToolError('tool call aborted', 'ABORTED', 'AbortError'))
        }, { once: true })
      })
    },
  })

  const confStatus = defineTool({
    name: 'conf_status',
    description: 'Report what happened to the conf_slow call recorded under key.',
    concurrency: 'always',
    parameters: { key: { type: 'string', required: true, description: 'The key given to conf_slow.' } },
    execute: async (args) => status.get(args.key) ?? 'unknown',
  })

  const confStream = defineTool({
    name: 'conf_stream',
    description: 'Stream count chunks of output, then finish.',
    parameters: { count: { type: 'integer', required: true, description: 'How many chunks.' } },
    async *execute(args) {
      for (let i = 1; i <= args.count; i++) yield { text: `chunk ${i}\n`, stream: 'stdout' }
      return `streamed ${args.count}`
    },
    presentCall: (args) => ({ card: 'terminal', title: `stream ${args.count}`, description: 'streams chunks' }),
    presentResult: (args) => ({
      card: 'terminal',
      output: Array.from({ length: args.count }, (_, i) => `chunk ${i + 1}\n`).join(''),
      exitCode: 0,
    }),
  })

  const confBarrier = defineTool({
    name: 'conf_barrier',
    description: 'Wait until n calls with the same key are running, then return.',
    concurrency: 'always',
    parameters: {
      key: { type: 'string', required: true, description: 'Barrier name.' },
      n: { type: 'integer', required: true, description: 'Number of calls to wait for.' },
    },
    execute: (args) => {
      const b = barriers.get(args.key) ?? { count: 0, waiters: [] }
      barriers.set(args.key, b)
      b.count++
      if (b.count >= args.n) {
        for (const w of b.waiters.splice(0)) w()
        return Promise.resolve(`released ${args.key}`)
      }
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new ToolError(`barrier ${args.key} timed out with ${b.count} of ${args.n} calls`, 'BARRIER_TIMEOUT')), 10000)
        b.waiters.push(() => {
          clearTimeout(timer)
          resolve(`released ${args.key}`)
        })
      })
    },
  })

  const confAddTool = defineTool({
    name: 'conf_add_tool',
    description: 'Add a tool named name at runtime; it returns "dynamic <name>".',
    parameters: { name: { type: 'string', required: true, description: "The new tool's name." } },
    execute: async (args) => {
      try {
        host.add(defineTool({ name: args.name, description: 'A tool added at runtime.', parameters: {}, execute: async () => `dynamic ${args.name}` }))
      } catch (e) {
        throw new ToolError(e.message, 'DUPLICATE_TOOL')
      }
      return `added ${args.name}`
    },
  })

  return [confEcho, confFail, confSlow, confStatus, confStream, confBarrier, confAddTool]
}
