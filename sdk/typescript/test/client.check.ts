// Type checks of the client typings (tsc, no run): messages are the
// generated protobuf-es types.
import { AgentClient, ApprovalDecision } from '../src/client.js'
import type { SessionEvent } from '../gen/dsh/session/v1/session_pb.js'

export async function drive(agent: AgentClient): Promise<bigint> {
  const session = await agent.createSession({ cwd: '/tmp', provider: 'scripted', model: 'scripted' })
  const id: string = session.header?.id ?? ''
  const events = agent.streamEvents(id, { includeProgress: true })
  await agent.send(id, ['hello', { block: { case: 'text', value: { text: 'there' } } }])
  let last: SessionEvent | undefined
  for await (const resp of events) {
    if (resp.progress) console.log(resp.progress.toolName, resp.progress.output?.text)
    if (resp.event?.payload.case === 'approvalAsked') await agent.respond(id, resp.event.payload.value.id, { decision: ApprovalDecision.ALLOW_ONCE })
    if (resp.event?.payload.case === 'turnEnd') {
      last = resp.event
      events.cancel()
    }
  }
  const idle = await agent.waitIdle(id, { timeoutMs: 1000 })
  // @ts-expect-error the status is an enum, not a string
  const s: string = idle.status
  void s
  return last?.seq ?? 0n
}
