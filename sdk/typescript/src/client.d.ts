import type { MessageInitShape } from '@bufbuild/protobuf'
import type { ChannelOptions } from '@grpc/grpc-js'
import type { ApprovalDecision, CancelResponse, SendResponse, Session, StreamEventsResponse } from '../gen/dsh/agent/v1/agent_pb.js'
import type { SessionOptions, SessionOptionsSchema, QuestionAnswerSchema } from '../gen/dsh/session/v1/session_pb.js'
import type { ContentBlockSchema } from '../gen/dsh/llm/v1/llm_pb.js'

export { ApprovalDecision } from '../gen/dsh/agent/v1/agent_pb.js'

export interface AgentClientOptions {
  /** Sent as `authorization: Bearer <token>` (agents with --auth token or jwt). */
  token?: string
  /** PEM CA file: connect with TLS. */
  rootCa?: string
  /** PEM client certificate and key files: mTLS. */
  clientCert?: string
  clientKey?: string
  channelOptions?: ChannelOptions
}

export type Content = string | MessageInitShape<typeof ContentBlockSchema> | Array<string | MessageInitShape<typeof ContentBlockSchema>>

/** StreamEventsResponse messages; cancel() ends the stream (the loop then ends quietly). */
export interface EventStream extends AsyncIterable<StreamEventsResponse> {
  cancel(): void
}

export type Answer =
  | { decision: ApprovalDecision; message?: string }
  | { answers: MessageInitShape<typeof QuestionAnswerSchema>[] }

/** A typed client of dsh.agent.v1.AgentService. */
export class AgentClient {
  constructor(target: string, opts?: AgentClientOptions)
  createSession(req: {
    cwd: string
    options?: SessionOptions
    sessionId?: string
    requestId?: string
    timeoutMs?: number
  } & MessageInitShape<typeof SessionOptionsSchema>): Promise<Session>
  getSession(sessionId: string, opts?: { timeoutMs?: number }): Promise<Session>
  send(sessionId: string, content: Content, opts?: { requestId?: string; timeoutMs?: number }): Promise<SendResponse>
  streamEvents(sessionId: string, opts?: { fromSeq?: bigint | number; follow?: boolean; includeProgress?: boolean }): EventStream
  respond(sessionId: string, requestId: string, answer: Answer, opts?: { timeoutMs?: number }): Promise<bigint>
  waitIdle(sessionId: string, opts?: { timeoutMs?: number }): Promise<Session>
  cancel(sessionId: string, opts?: { timeoutMs?: number }): Promise<CancelResponse>
  close(): void
}

/** The grpc-js service definition of a protobuf-es service descriptor. */
export function grpcDefinition(service: unknown, typeName?: string): Record<string, unknown>
