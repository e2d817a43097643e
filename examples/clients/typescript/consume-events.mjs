// Consume a dsh session's events from the DSH_EVENTS JetStream stream.
//
//   npm install <the @dsh/toolhost tarball> nats   # see docs/clients.md
//   NATS_URL=127.0.0.1:4222 node consume-events.mjs SESSION_ID
//
// An ordered consumer reads the session's events from the first, in order;
// prints "<seq> <event>[: text]" per event until the turn ends. Chunk deltas,
// most of the events, are skipped by their Dsh-Event-Type header unread.
import { connect } from 'nats'
import { fromBinary } from '@bufbuild/protobuf'
import { SessionEventSchema } from '@dsh/toolhost/gen/dsh/session/v1/session'

const id = process.argv[2]
if (!id) {
  console.error('usage: consume-events.mjs SESSION_ID')
  process.exit(2)
}
// A session id as one subject token, escaped as the agent escapes it.
const token = [...Buffer.from(id)].map((c) => (c <= 32 || c > 126 || '.*>%'.includes(String.fromCharCode(c)) ? `%${c.toString(16).toUpperCase().padStart(2, '0')}` : String.fromCharCode(c))).join('')
const snake = (s) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)
const textOf = (blocks) => blocks.map((b) => (b.block.case === 'text' ? b.block.value.text : '')).join('').trim().replaceAll('\n', '\\n')

const nc = await connect({ servers: process.env.NATS_URL ?? '127.0.0.1:4222' })
const consumer = await nc.jetstream().consumers.get('DSH_EVENTS', { filterSubjects: [`dsh.events.*.${token}`] })
const messages = await consumer.consume()
for await (const m of messages) {
  const type = m.headers?.get('Dsh-Event-Type')
  if (type === 'assistant/chunk') continue
  if (m.headers?.has('Dsh-Event-Omitted')) {
    console.log(`${m.headers.get('Dsh-Seq')} omitted (${type})`) // over max_payload: fetch it from the agent
    continue
  }
  const event = fromBinary(SessionEventSchema, m.data)
  const { case: kind, value } = event.payload
  const text = kind === 'assistantMessage' || kind === 'toolResult' ? textOf(value.content) : ''
  console.log(`${event.seq} ${snake(kind)}${text ? `: ${text}` : ''}`)
  if (kind === 'turnEnd') break
}
await nc.close()
