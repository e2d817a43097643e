// Tool definitions (defineTool / rawTool) and the transport-free run of one
// call: parse → validate → body (with an AbortSignal and an emit callback) →
// result → result view. A body that throws becomes an `Error: <message>`
// result; nothing a tool does can take the host down. Any throw other than a
// ToolError or an abort is also logged with its stack at the host (the
// model gets only the message).

import { specToJsonSchema, validateArgs } from './schema.js'
import { syntaxError } from './jsonsyntax.js'
import { blockToProto, callViewToProto, resultViewToProto } from './views.js'

/** A typed failure: the model sees `Error: <message>` and the result carries {name, code}. */
export class ToolError extends Error {
  constructor(message, code = 'TOOL_ERROR', name = 'ToolError') {
    super(message)
    this.code = code
    this.errorName = name
  }
}

const CONCURRENCY = { never: 'CONCURRENCY_SAFETY_UNSPECIFIED', always: 'CONCURRENCY_SAFETY_ALWAYS', per_call: 'CONCURRENCY_SAFETY_PER_CALL' }

function checkCommon(def) {
  if (typeof def.name !== 'string' || def.name === '') throw new TypeError('a tool needs a name')
  if (typeof def.execute !== 'function') throw new TypeError(`tool ${def.name}: execute must be a function`)
  if (def.timeoutMs !== undefined && !(Number.isFinite(def.timeoutMs) && def.timeoutMs > 0)) {
    throw new RangeError(`tool ${def.name}: timeoutMs must be a positive finite number`)
  }
  const c = def.concurrency ?? (def.isConcurrencySafe ? 'per_call' : 'never')
  if (!(c in CONCURRENCY)) throw new TypeError(`tool ${def.name}: concurrency must be never, always or per_call`)
  return c
}

/**
 * Define a typed tool from a SchemaSpec. Arguments are validated before
 * execute runs; presenters and the classifier validate softly.
 */
export function defineTool(def) {
  const concurrency = checkCommon(def)
  const spec = def.parameters ?? {}
  return Object.freeze({
    name: def.name,
    description: def.description ?? '',
    parameters: specToJsonSchema(spec),
    spec,
    validatesArguments: true,
    concurrency,
    timeoutMs: def.timeoutMs ?? 0,
    execute: def.execute,
    presentCall: def.presentCall,
    presentResult: def.presentResult,
    isConcurrencySafe: def.isConcurrencySafe,
  })
}

/** Define a tool from a raw JSON Schema; execute receives unvalidated arguments. */
export function rawTool(def) {
  const concurrency = checkCommon(def)
  const p = def.parameters
  if (p === null || typeof p !== 'object' || p.type !== 'object') throw new TypeError(`tool ${def.name}: parameters must be a JSON Schema object`)
  return Object.freeze({
    name: def.name,
    description: def.description ?? '',
    parameters: p,
    spec: undefined,
    validatesArguments: false,
    concurrency,
    timeoutMs: def.timeoutMs ?? 0,
    execute: def.execute,
    presentCall: def.presentCall,
    presentResult: def.presentResult,
    isConcurrencySafe: def.isConcurrencySafe,
  })
}

/** The wire ToolDescriptor of a tool. */
export function descriptor(t) {
  return {
    schema: { name: t.name, description: t.description, parameters: JSON.stringify(t.parameters), strict: false },
    concurrency: CONCURRENCY[t.concurrency],
    timeoutMs: String(t.timeoutMs),
    validatesArguments: t.validatesArguments,
  }
}

/**
 * Parse the model's argument text; the error is worded as every dsh host
 * words it (see jsonsyntax.js; empty text is not JSON).
 */
export function parseArguments(raw) {
  const bad = syntaxError(raw)
  if (bad !== undefined) return { error: `arguments are not valid JSON: ${bad}` }
  try {
    return { args: JSON.parse(raw) }
  } catch (e) {
    return { error: `arguments are not valid JSON: ${e.message}` }
  }
}

function valid(t, args) {
  if (args === null || typeof args !== 'object' || Array.isArray(args)) return false
  return !t.validatesArguments || validateArgs(t.spec, args).length === 0
}

/** The scheduling class of one call ('EXECUTION_MODE_PARALLEL' | 'EXECUTION_MODE_EXCLUSIVE'). */
export function executionMode(t, args) {
  if (t.concurrency === 'always') return 'EXECUTION_MODE_PARALLEL'
  if (t.concurrency === 'per_call' && t.isConcurrencySafe && valid(t, args)) {
    try {
      if (t.isConcurrencySafe(args) === true) return 'EXECUTION_MODE_PARALLEL'
    } catch {
      // a throwing classifier means exclusive
    }
  }
  return 'EXECUTION_MODE_EXCLUSIVE'
}

/** The wire call view, or undefined (generic fallback). */
export function callView(t, args) {
  if (!t.presentCall || !valid(t, args)) return undefined
  try {
    const v = t.presentCall(args)
    return v ? callViewToProto(v) : undefined
  } catch {
    return undefined
  }
}

function resultView(t, args, result) {
  if (!t.presentResult || !valid(t, args)) return undefined
  try {
    const v = t.presentResult(args, result)
    return v ? resultViewToProto(v) : undefined
  } catch {
    return undefined
  }
}

/** The canonical failure result (author-facing shape). */
export function errorResult(message, code, name) {
  const r = { content: [{ type: 'text', text: `Error: ${message}` }], isError: true }
  if (code) r.error = { name: name ?? '', code }
  return r
}

function messageOf(e) {
  if (e instanceof Error) return e.message || e.name
  return String(e)
}

function normalize(value) {
  if (value === undefined || value === null) return { content: [] }
  if (typeof value === 'string') return { content: [{ type: 'text', text: value }] }
  if (Array.isArray(value)) return { content: value.map((b) => (typeof b === 'string' ? { type: 'text', text: b } : b)) }
  if (typeof value === 'object' && Array.isArray(value.content)) {
    return { ...normalize(value.content), meta: value.meta, isError: value.isError === true }
  }
  if (typeof value === 'object' && typeof value.content === 'string') {
    return { content: [{ type: 'text', text: value.content }], meta: value.meta, isError: value.isError === true }
  }
  return { content: [{ type: 'text', text: JSON.stringify(value) }] }
}

const isAsyncIterator = (v) => v !== null && typeof v === 'object' && typeof v[Symbol.asyncIterator] === 'function' && typeof v.next === 'function'
const isIterator = (v) => v !== null && typeof v === 'object' && typeof v[Symbol.iterator] === 'function' && typeof v.next === 'function' && !Array.isArray(v)

async function drain(gen, ctx) {
  for (;;) {
    if (ctx.signal.aborted) {
      await gen.return?.(undefined)
      throw ctx.signal.reason ?? new Error('tool call aborted')
    }
    const { value, done } = await gen.next()
    if (done) return value
    if (typeof value === 'string') ctx.emit(value)
    else if (value && typeof value.text === 'string') ctx.emit(value.text, value.stream ?? 'stdout')
    else throw new TypeError('a streaming tool must yield strings or {text, stream}')
  }
}

/**
 * Run one call to completion. `execution` is the wire ToolExecution; `signal`
 * aborts when the caller cancels; `emit(stream, text)` sends live output.
 * Resolves to the wire ToolExecutionResult; never rejects for tool failures.
 */
export async function runCall(t, execution, { signal, emit, logger = stderrLogger }) {
  const r = await runCallAuthor(t, execution, { signal, emit, logger })
  return toProtoResult(r)
}

/** The default logger: one line (plus the stack) on stderr. */
export const stderrLogger = { error: (msg) => process.stderr.write(`${new Date().toISOString()} ERROR dsh-toolhost: ${msg}\n`) }

/** Log an unexpected throw of a tool body with its stack. */
export function logFailure(logger, toolName, ctx, e) {
  const detail = e instanceof Error ? (e.stack ?? `${e.name}: ${e.message}`) : `thrown value: ${String(e)}`
  logger.error(`tool ${toolName} failed (call ${ctx.callId || '-'}, session ${ctx.sessionId || '-'}): ${messageOf(e)}\n${detail}`)
}

async function runCallAuthor(t, execution, { signal, emit, logger }) {
  if (!t) return errorResult(`unknown tool "${execution.name}"`, 'UNKNOWN_TOOL', 'ToolNotFoundError')
  const parsed = parseArguments(execution.arguments ?? '')
  if (parsed.error) return errorResult(`invalid arguments: ${parsed.error}`, 'INVALID_ARGS', 'ToolArgsError')
  const args = parsed.args
  if (t.validatesArguments) {
    const violations = validateArgs(t.spec, args)
    if (violations.length > 0) return errorResult(`invalid arguments: ${violations.join('; ')}`, 'INVALID_ARGS', 'ToolArgsError')
  }
  const c = execution.context ?? {}
  const ctx = {
    callId: execution.callId,
    toolName: execution.name,
    sessionId: c.sessionId ?? '',
    cwd: c.cwd ?? '',
    workspaceRoot: c.workspaceRoot ?? '',
    sandbox: sandboxPolicy(c.sandbox),
    turn: c.turn ?? 0,
    step: c.step ?? 0,
    signal,
    emit: (text, stream = 'stdout') => emit(stream, String(text)),
  }
  let result
  try {
    let value = t.execute(Object.freeze(structuredClone(args)), ctx)
    if (value && typeof value.then === 'function') value = await value
    if (isAsyncIterator(value) || isIterator(value)) value = await drain(value, ctx)
    result = normalize(value)
    result.content.forEach(blockToProto) // throws on content that is not blocks
    if (result.meta !== undefined) JSON.stringify(result.meta)
  } catch (e) {
    if (e instanceof ToolError) result = errorResult(e.message, e.code, e.errorName)
    else if (signal.aborted) result = errorResult('tool call aborted', 'ABORTED', 'AbortError')
    else {
      logFailure(logger, t.name, ctx, e)
      result = errorResult(messageOf(e))
    }
  }
  const view = resultView(t, args, { content: result.content, isError: result.isError === true, meta: result.meta })
  if (view) result.view = view
  return result
}

/** Convert an author-facing result to the wire ToolExecutionResult. */
export function toProtoResult(r) {
  const out = { content: r.content.map(blockToProto), isError: r.isError === true }
  if (r.error) out.error = r.error
  if (r.meta !== undefined) out.meta = JSON.stringify(r.meta)
  if (r.view) out.view = r.view
  return out
}

const MODES = { SANDBOX_MODE_READ_ONLY: 'read-only', SANDBOX_MODE_WORKSPACE_WRITE: 'workspace-write', SANDBOX_MODE_DANGER_FULL_ACCESS: 'danger-full-access' }
const NETWORK = { NETWORK_ACCESS_ON: 'on', NETWORK_ACCESS_OFF: 'off' }

/** A call's sandbox policy as plain strings, or null when the agent sent none. */
export function sandboxPolicy(p) {
  if (!p) return null
  const mode = MODES[p.mode] ?? ''
  const network = NETWORK[p.network] ?? ''
  return mode || network ? { mode, network } : null
}
