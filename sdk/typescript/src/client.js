// A typed client of the agent's dsh.agent.v1.AgentService: create a session,
// send to it, follow its events (and, on request, the live output of running
// tools), answer approvals and questions, wait until it is idle. Messages are
// the protobuf-es types generated in gen/ (int64 fields are bigint).
//
//   import { AgentClient } from '@dsh/toolhost/client'
//   const agent = new AgentClient('127.0.0.1:7700')
//   const session = await agent.createSession({ cwd: process.cwd() })
//   const events = agent.streamEvents(session.header.id)
//   await agent.send(session.header.id, 'list the files')
//   for await (const { event } of events) if (event?.payload.case === 'turnEnd') break
//   agent.close()
//
// RPC failures reject with grpc-js errors (code = the agent's status code).
// `token` is sent as `authorization: Bearer <token>`; rootCa / clientCert /
// clientKey (PEM file paths) turn on TLS and mTLS.

import fs from 'node:fs'
import * as grpc from '@grpc/grpc-js'
import { create } from '@bufbuild/protobuf'
import { grpcDefinition } from './grpcdef.js'
import { AgentService } from '../gen/dsh/agent/v1/agent_pb.js'
import { SessionOptionsSchema } from '../gen/dsh/session/v1/session_pb.js'

const AgentServiceClient = grpc.makeGenericClientConstructor(grpcDefinition(AgentService), 'AgentService')

const blocks = (content) =>
  (Array.isArray(content) ? content : [content]).map((c) => (typeof c === 'string' ? { block: { case: 'text', value: { text: c } } } : c))

export class AgentClient {
  #metadata = new grpc.Metadata()

  constructor(target, { token, rootCa, clientCert, clientKey, channelOptions } = {}) {
    const read = (p) => (p ? fs.readFileSync(p) : null)
    const creds = rootCa || clientCert ? grpc.credentials.createSsl(read(rootCa), read(clientKey), read(clientCert)) : grpc.credentials.createInsecure()
    this.grpc = new AgentServiceClient(target, creds, channelOptions)
    if (token) this.#metadata.set('authorization', `Bearer ${token}`)
  }

  #unary(method, req, timeoutMs) {
    const opts = timeoutMs ? { deadline: Date.now() + timeoutMs } : {}
    return new Promise((resolve, reject) => this.grpc[method](req, this.#metadata, opts, (err, resp) => (err ? reject(err) : resolve(resp))))
  }

  /** Create a session; provider, model, workspaceRoot... fill SessionOptions when options is not given. */
  async createSession({ cwd, options, sessionId = '', requestId = '', timeoutMs, ...optionFields }) {
    const req = { sessionId, cwd, requestId, options: options ?? create(SessionOptionsSchema, optionFields) }
    return (await this.#unary('CreateSession', req, timeoutMs)).session
  }

  async getSession(sessionId, { timeoutMs } = {}) {
    return (await this.#unary('GetSession', { sessionId }, timeoutMs)).session
  }

  /** Queue a user message (a string or content blocks); resolves at once with the agent's status. */
  send(sessionId, content, { requestId = '', timeoutMs } = {}) {
    return this.#unary('Send', { sessionId, content: blocks(content), requestId }, timeoutMs)
  }

  /**
   * The session's events from fromSeq on, as an async iterable of
   * StreamEventsResponse ({event} or, with includeProgress, the live
   * non-durable {progress} of running tools); with follow (the default) it
   * stays open for new events until cancel().
   */
  streamEvents(sessionId, { fromSeq = 0n, follow = true, includeProgress = false } = {}) {
    const call = this.grpc.StreamEvents({ sessionId, fromSeq: BigInt(fromSeq), noFollow: !follow, includeProgress }, this.#metadata)
    let cancelled = false
    return {
      cancel() {
        cancelled = true
        call.cancel()
      },
      async *[Symbol.asyncIterator]() {
        try {
          for await (const resp of call) yield resp
        } catch (e) {
          if (!(cancelled && e.code === grpc.status.CANCELLED)) throw e
        } finally {
          if (!cancelled) call.cancel()
        }
      },
    }
  }

  /**
   * Answer a pending approval ({decision: ApprovalDecision.ALLOW_ONCE |
   * ALLOW_FOR_SESSION | REJECT, message?}) or question ({answers}); resolves
   * to the seq (bigint) of the event that recorded it.
   */
  async respond(sessionId, requestId, answer, { timeoutMs } = {}) {
    const req = { sessionId, requestId }
    req.answer = answer.decision !== undefined
      ? { case: 'approval', value: { decision: answer.decision, message: answer.message ?? '' } }
      : { case: 'question', value: { answers: answer.answers ?? [] } }
    return (await this.#unary('Respond', req, timeoutMs)).seq
  }

  /** Resolve once the session has nothing running or queued. */
  async waitIdle(sessionId, { timeoutMs } = {}) {
    return (await this.#unary('WaitIdle', { sessionId }, timeoutMs)).session
  }

  /** Cancel the running turn. */
  cancel(sessionId, { timeoutMs } = {}) {
    return this.#unary('Cancel', { sessionId }, timeoutMs)
  }

  close() {
    this.grpc.close()
  }
}

export { ApprovalDecision } from '../gen/dsh/agent/v1/agent_pb.js'
export { grpcDefinition } from './grpcdef.js'
