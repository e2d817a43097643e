// Drive a dsh session from Node: create it, send a prompt, print its events
// (and the live output of running tools) until the turn ends, wait until idle.
//
//   npm install <the @dsh/toolhost tarball>     # see docs/clients.md
//   DSH_AGENT=127.0.0.1:7700 node drive-session.mjs "list the files"
//
// Prints "<seq> <event>[: text]" per event (chunk deltas skipped) and, last,
// "session <id> <status>". $DSH_TOKEN is sent as a bearer token.
import { AgentClient } from '@dsh/toolhost/client'
import { AgentStatus } from '@dsh/toolhost/gen/dsh/agent/v1/agent'

const env = process.env
const snake = (s) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)
const textOf = (blocks) => blocks.map((b) => (b.block.case === 'text' ? b.block.value.text : '')).join('').trim().replaceAll('\n', '\\n')

const agent = new AgentClient(env.DSH_AGENT ?? '127.0.0.1:7700', { token: env.DSH_TOKEN })
try {
  const session = await agent.createSession({ cwd: process.cwd(), provider: env.DSH_PROVIDER ?? '', model: env.DSH_MODEL ?? '' })
  const id = session.header.id
  const events = agent.streamEvents(id, { includeProgress: true })
  await agent.send(id, process.argv.slice(2).join(' ') || 'say hello')
  for await (const { event, progress } of events) {
    if (progress) {
      // live and not durable: not in the log, not on NATS
      console.log(`progress ${progress.toolName}: ${progress.output?.text.trim()}`)
      continue
    }
    const { case: kind, value } = event.payload
    if (kind === 'assistantChunk') continue // deltas: the whole message follows
    const text = kind === 'assistantMessage' || kind === 'toolResult' ? textOf(value.content) : ''
    console.log(`${event.seq} ${snake(kind)}${text ? `: ${text}` : ''}`)
    if (kind === 'turnEnd') events.cancel()
  }
  const idle = await agent.waitIdle(id, { timeoutMs: 30000 })
  console.log(`session ${id} AGENT_STATUS_${AgentStatus[idle.status]}`)
} finally {
  agent.close()
}
