// Compile-time checks of the typed schema (run with `npm run typecheck`).
import { defineTool, EnvError } from '../src/index.js'

defineTool({
  name: 'read_file',
  parameters: {
    path: { type: 'string', required: true },
    offset: { type: 'number' },
    mode: { type: 'string', enum: ['a', 'b'] },
    opts: { type: 'object', properties: { flag: { type: 'boolean', required: true } } },
  },
  execute(args) {
    const p: string = args.path
    const o: number | null | undefined = args.offset
    const m: 'a' | 'b' | null | undefined = args.mode
    const f: boolean | undefined = args.opts?.flag
    // @ts-expect-error path is readonly
    args.path = 'x'
    return [{ type: 'text', text: `${p}${o}${m}${f}` }]
  },
  presentCall: (args) => ({ card: 'terminal', title: args.path }),
})

// A malformed environment variable: the variable and value are on the error.
const envErr = new EnvError('DSH_INSECURE', 'ture', 'not a boolean')
const envErrFields: [string, string, string, string] = [envErr.variable, envErr.value, envErr.reason, envErr.message]
void envErrFields
