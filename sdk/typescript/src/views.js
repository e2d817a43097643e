// Content blocks and presentation views (semantics §6.6) in their
// author-facing shape, and their conversion to the dsh.tools.v1 wire shape.

const KINDS = ['read', 'edit', 'delete', 'move', 'search', 'execute', 'fetch', 'other']

/** A text block. */
export const text = (s) => ({ type: 'text', text: String(s) })

/** Convert one author-facing block ({type:'text'|'image', ...}) to a dsh.llm.v1.ContentBlock. */
export function blockToProto(b) {
  if (typeof b === 'string') return { text: { text: b } }
  if (b === null || typeof b !== 'object') throw new TypeError(`a content block must be an object, got ${typeof b}`)
  switch (b.type) {
    case 'text':
      if (typeof b.text !== 'string') throw new TypeError('a text block needs a string text')
      return { text: { text: b.text } }
    case 'image': {
      if ((b.url === undefined) === (b.data === undefined)) throw new TypeError('an image block needs exactly one of url or data')
      if (b.data !== undefined) {
        if (!b.mimeType) throw new TypeError('an inline image block needs a mimeType')
        const data = typeof b.data === 'string' ? Buffer.from(b.data, 'base64') : Buffer.from(b.data)
        return { image: { data, mimeType: b.mimeType } }
      }
      return { image: { url: b.url, mimeType: b.mimeType || '' } }
    }
    default:
      if (typeof b.type === 'string' && b.type !== '') {
        const { type, ...rest } = b
        return { extension: { type, json: JSON.stringify(rest) } }
      }
      throw new TypeError('a content block needs a type')
  }
}

/** Convert a wire ContentBlock back to the author-facing shape. */
export function blockFromProto(b) {
  if (b.text) return { type: 'text', text: b.text.text }
  if (b.image) return b.image.url ? { type: 'image', url: b.image.url, mimeType: b.image.mimeType } : { type: 'image', data: b.image.data, mimeType: b.image.mimeType }
  if (b.extension) return { type: b.extension.type, ...JSON.parse(b.extension.json || '{}') }
  return { type: 'unknown' }
}

const blocks = (content) => (content ?? []).map(blockToProto)

function loc(l) {
  const out = { path: l.path }
  if (l.line !== undefined && l.line !== null) out.line = l.line
  return out
}

function diff(d) {
  const out = { path: d.path, newText: d.newText ?? '' }
  if (d.oldText !== null && d.oldText !== undefined) out.oldText = d.oldText
  return out
}

/** Convert a ToolCallView ({card:'generic'|'terminal'|'diff', ...}) to the wire shape. */
export function callViewToProto(v) {
  switch (v.card) {
    case 'generic': {
      if (v.kind !== undefined && !KINDS.includes(v.kind)) throw new TypeError(`unknown tool call kind ${v.kind}`)
      return {
        generic: {
          title: v.title ?? '',
          kind: v.kind ? `TOOL_CALL_KIND_${v.kind.toUpperCase()}` : 'TOOL_CALL_KIND_UNSPECIFIED',
          rawInput: v.rawInput ?? '',
          content: blocks(v.content),
          locations: (v.locations ?? []).map(loc),
        },
      }
    }
    case 'terminal':
      return { terminal: { title: v.title ?? '', description: v.description ?? '', cwd: v.cwd ?? '' } }
    case 'diff':
      return { diff: { title: v.title ?? '', diffs: (v.diffs ?? []).map(diff), locations: (v.locations ?? []).map(loc) } }
    default:
      throw new TypeError(`unknown call card ${v.card}`)
  }
}

/** Convert a ToolResultView to the wire shape. */
export function resultViewToProto(v) {
  switch (v.card) {
    case 'generic':
      return { generic: { title: v.title ?? '', content: blocks(v.content) } }
    case 'terminal': {
      const t = { title: v.title ?? '', output: v.output ?? '', signal: v.signal ?? '' }
      if (v.exitCode !== undefined && v.exitCode !== null) t.exitCode = v.exitCode
      return { terminal: t }
    }
    case 'diff':
      return { diff: { title: v.title ?? '', diffs: (v.diffs ?? []).map(diff) } }
    default:
      throw new TypeError(`unknown result card ${v.card}`)
  }
}
