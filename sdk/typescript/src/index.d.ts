// Types of @dsh/toolhost. The runtime is plain ESM JavaScript (Node 20 runs
// it without a build step); these declarations give TypeScript authors typed
// arguments inferred from the SchemaSpec, as in the original defineTool.

export type SchemaType = 'string' | 'number' | 'integer' | 'boolean' | 'object' | 'array'

export interface SchemaProp {
  type: SchemaType
  required?: true
  description?: string
  enum?: readonly (string | number | boolean)[]
  default?: unknown
  properties?: SchemaSpec
  items?: SchemaProp
}
export type SchemaSpec = Record<string, SchemaProp>

type Base<P extends SchemaProp> = P['enum'] extends readonly (infer E)[]
  ? E
  : P['type'] extends 'string'
    ? string
    : P['type'] extends 'number' | 'integer'
      ? number
      : P['type'] extends 'boolean'
        ? boolean
        : P['type'] extends 'array'
          ? P['items'] extends SchemaProp
            ? Base<P['items']>[]
            : unknown[]
          : P['type'] extends 'object'
            ? P['properties'] extends SchemaSpec
              ? InferArgs<P['properties']>
              : Record<string, unknown>
            : unknown

/** Required props become required keys; everything else is optional. */
export type InferArgs<S extends SchemaSpec> = {
  readonly [K in keyof S as S[K]['required'] extends true ? K : never]: Base<S[K]>
} & {
  readonly [K in keyof S as S[K]['required'] extends true ? never : K]?: Base<S[K]> | null
}

export type ContentBlock =
  | { type: 'text'; text: string }
  | { type: 'image'; url: string; mimeType?: string }
  | { type: 'image'; data: Uint8Array | string; mimeType: string }
  | { type: string; [k: string]: unknown }

export type ToolCallKind = 'read' | 'edit' | 'delete' | 'move' | 'search' | 'execute' | 'fetch' | 'other'
export interface FileLocation { path: string; line?: number }
export interface FileDiff { path: string; oldText: string | null; newText: string }

export type ToolCallView =
  | { card: 'generic'; title: string; kind?: ToolCallKind; rawInput?: string; content?: ContentBlock[]; locations?: FileLocation[] }
  | { card: 'terminal'; title: string; description?: string; cwd?: string }
  | { card: 'diff'; title: string; diffs: FileDiff[]; locations?: FileLocation[] }

export type ToolResultView =
  | { card: 'generic'; title?: string; content?: ContentBlock[] }
  | { card: 'terminal'; title?: string; output?: string; exitCode?: number; signal?: string }
  | { card: 'diff'; title?: string; diffs: FileDiff[] }

/** What a result presenter receives. */
export interface ToolResult { content: ContentBlock[]; isError: boolean; meta?: unknown }

/** The context of one call. */
export interface ToolRunContext {
  callId: string
  toolName: string
  sessionId: string
  cwd: string
  workspaceRoot: string
  /** The call's confinement as the agent resolved it; null when none was sent. */
  sandbox: { mode: 'read-only' | 'workspace-write' | 'danger-full-access' | ''; network: 'on' | 'off' | '' } | null
  turn: number
  step: number
  /** Aborts when the caller cancels the RPC. */
  signal: AbortSignal
  /** Send a chunk of live output ("stdout" by default). */
  emit(text: string, stream?: string): void
}

export type Chunk = string | { text: string; stream?: string }
export type ToolReturn = string | ContentBlock[] | { content: ContentBlock[] | string; meta?: unknown; isError?: boolean } | unknown
export type ExecuteFn<A> = (
  args: A,
  ctx: ToolRunContext,
) => ToolReturn | Promise<ToolReturn> | AsyncGenerator<Chunk, ToolReturn, void> | Generator<Chunk, ToolReturn, void>

export type Concurrency = 'never' | 'always' | 'per_call'

export interface ToolDefinition<A = unknown> {
  readonly name: string
  readonly description: string
  readonly parameters: Record<string, unknown>
  readonly validatesArguments: boolean
  readonly concurrency: Concurrency
  readonly timeoutMs: number
}

export interface DefineToolOptions<S extends SchemaSpec> {
  name: string
  description?: string
  parameters?: S
  concurrency?: Concurrency
  timeoutMs?: number
  isConcurrencySafe?(args: InferArgs<S>): boolean
  execute: ExecuteFn<InferArgs<S>>
  presentCall?(args: InferArgs<S>): ToolCallView | undefined
  presentResult?(args: InferArgs<S>, result: ToolResult): ToolResultView | undefined
}

export function defineTool<const S extends SchemaSpec>(def: DefineToolOptions<S>): ToolDefinition<InferArgs<S>>

export interface RawToolOptions {
  name: string
  description?: string
  parameters: Record<string, unknown> & { type: 'object' }
  concurrency?: Concurrency
  timeoutMs?: number
  isConcurrencySafe?(args: unknown): boolean
  execute: ExecuteFn<unknown>
  presentCall?(args: unknown): ToolCallView | undefined
  presentResult?(args: unknown, result: ToolResult): ToolResultView | undefined
}
export function rawTool(def: RawToolOptions): ToolDefinition<unknown>

/** A typed failure: `Error: <message>` plus {name, code} on the result. */
export class ToolError extends Error {
  constructor(message: string, code?: string, name?: string)
  code: string
  errorName: string
}

export function specToJsonSchema(spec: SchemaSpec): Record<string, unknown>
export function validateArgs(spec: SchemaSpec, args: unknown): string[]
export function text(s: string): { type: 'text'; text: string }

/** Where a host logs a tool's unexpected throw (with its stack); the default writes to stderr. */
export interface Logger {
  error(message: string): void
}

export class ToolHost {
  constructor(tools?: ToolDefinition<any>[], opts?: { maxArgumentBytes?: number; enforcesSandbox?: boolean; workspaceContext?: (cwd: string, workspaceRoot: string) => any; logger?: Logger })
  /** SANDBOX_SUPPORT_ENFORCED when constructed with enforcesSandbox, else SANDBOX_SUPPORT_UNSPECIFIED. */
  readonly sandboxSupport: string
  add(tool: ToolDefinition<any>): void
  remove(name: string): boolean
  get(name: string): ToolDefinition<any> | undefined
  readonly revision: number
  close(): void
}

export class Interceptor {
  preExecute(execution: any): Promise<unknown> | unknown
  postExecute(execution: any, result: any): Promise<unknown> | unknown
}
export function allow(): unknown
export function deny(reason: string): unknown
export function ask(reason?: string): unknown
export function accept(content?: ContentBlock[], additionalContexts?: unknown[]): unknown
export function block(feedback: ContentBlock[], additionalContexts?: unknown[]): unknown

/** Transport-security options of Server and serve() (mirroring the Go servers' --tls-cert, --tls-key, --tls-client-ca, --allow-peer, --insecure). */
export interface TLSOptions {
  /** PEM certificate file: serve TLS (with tlsKey). Env DSH_TLS_CERT in serve(). */
  tlsCert?: string
  /** PEM private key file. Env DSH_TLS_KEY. */
  tlsKey?: string
  /** PEM CA bundle: client certificates are required and verified (mTLS). Env DSH_TLS_CLIENT_CA. */
  tlsClientCa?: string
  /** URI SANs (e.g. spiffe://dsh/agent) or DNS SANs a client certificate must carry. Env DSH_ALLOW_PEER. */
  allowPeers?: string[]
  /**
   * Allow a plaintext listen on a non-loopback address (with a warning). Env DSH_INSECURE in serve():
   * true is 1, t, true, yes or on; false is 0, f, false, no or off (any case, no surrounding
   * space, as in Go); unset or empty is false. Any other value rejects serve() with an EnvError before
   * anything listens, even when this option is given.
   */
  insecure?: boolean
}
export class TLSConfigError extends Error {}
/** An environment variable whose value does not parse; the message is `NAME="VALUE": REASON` (the accepted forms and the default). */
export class EnvError extends Error {
  constructor(variable: string, value: string, reason: string)
  /** The variable, e.g. DSH_INSECURE. */
  readonly variable: string
  /** Its value, as given. */
  readonly value: string
  /** What is wrong: the accepted forms and the default. */
  readonly reason: string
}
export function isLoopback(address: string): boolean
export class Server {
  constructor(opts: { host?: ToolHost; interceptor?: Interceptor; refreshIntervalMs?: number } & TLSOptions)
  listen(address?: string): Promise<string>
  stop(graceMs?: number): Promise<void>
  address?: string
}
export function serve(
  tools?: ToolDefinition<any>[],
  opts?: { host?: ToolHost; address?: string; interceptor?: Interceptor; graceMs?: number } & TLSOptions,
): Promise<Server>
export function runCall(tool: ToolDefinition<any> | undefined, execution: any, io: { signal: AbortSignal; emit(stream: string, text: string): void; logger?: Logger }): Promise<any>
export function errorResult(message: string, code?: string, name?: string): any
export function descriptor(tool: ToolDefinition<any>): any
export function loadProtos(): { tools: any; health: any; definition: object }
