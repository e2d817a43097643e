// @dsh/toolhost: write a dsh toolhost in JavaScript or TypeScript.
//
//   import { defineTool, serve } from '@dsh/toolhost'
//   const greet = defineTool({
//     name: 'greet', description: 'Greet someone.',
//     parameters: { name: { type: 'string', required: true, description: 'Who to greet.' } },
//     concurrency: 'always',
//     async execute(args) { return `hello ${args.name}` },
//   })
//   await serve([greet])

export { defineTool, rawTool, ToolError, runCall, errorResult, descriptor } from './tool.js'
export { specToJsonSchema, validateArgs } from './schema.js'
export { ToolHost, Server, Health, serve, TLSConfigError, EnvError, isLoopback } from './host.js'
export { Interceptor, allow, deny, ask, accept, block } from './interceptor.js'
export { text } from './views.js'
export { loadProtos } from './proto.js'
