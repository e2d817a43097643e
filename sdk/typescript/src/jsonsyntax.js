// Why argument text is not JSON, worded exactly as every dsh host words it:
// `arguments are not valid JSON: <reason>`, where reason is Go's
// encoding/json syntax error ("invalid character 'x' looking for beginning
// of value", "... after object key", ...), "unexpected end of JSON input" for
// empty or truncated text and "unexpected data after the JSON value" for text
// after the first value. The conformance suite (tests/conformance) checks the
// Go, Python and TypeScript hosts give identical messages; the Python twin is
// sdk/python/dsh_toolhost/jsonsyntax.py. The scan runs over the UTF-8 bytes,
// as Go's does, so a stray non-ASCII byte is quoted the way Go quotes it.

const MAX_DEPTH = 10000
const isWS = (c) => c === 0x20 || c === 0x09 || c === 0x0d || c === 0x0a
const isDigit = (c) => c >= 0x30 && c <= 0x39
const isHex = (c) => isDigit(c) || (c >= 0x61 && c <= 0x66) || (c >= 0x41 && c <= 0x46)
const ESCAPES = new Set([...'"\\/bfnrtu'].map((ch) => ch.charCodeAt(0)))
const LITERALS = { 0x74: 'true', 0x66: 'false', 0x6e: 'null' }
const GO_ESCAPES = { 7: '\\a', 8: '\\b', 12: '\\f', 10: '\\n', 13: '\\r', 9: '\\t', 11: '\\v', 92: '\\\\' }

/** Go's quoteChar: the byte as a rune, quoted like strconv.Quote. */
function quote(c) {
  if (c === 0x27) return "'\\''"
  if (c === 0x22) return "'\"'"
  if (GO_ESCAPES[c]) return `'${GO_ESCAPES[c]}'`
  if (c < 0x20 || c === 0x7f) return `'\\x${c.toString(16).padStart(2, '0')}'`
  if ((c >= 0x80 && c <= 0xa0) || c === 0xad) return `'\\u${c.toString(16).padStart(4, '0')}'`
  return `'${String.fromCharCode(c)}'`
}

class Bad extends Error {}

/** The reason `text` is not one JSON value, or undefined when it is. */
export function syntaxError(text) {
  const b = Buffer.from(text, 'utf8')
  let i = 0
  const peek = () => {
    if (i >= b.length) throw new Bad('unexpected end of JSON input')
    return b[i]
  }
  const bad = (context) => new Bad(`invalid character ${quote(b[i])} ${context}`)
  const ws = () => {
    while (i < b.length && isWS(b[i])) i++
  }
  const digits = () => {
    while (i < b.length && isDigit(b[i])) i++
  }
  const string = () => {
    i++
    for (;;) {
      const c = peek()
      if (c === 0x22) return void i++
      if (c === 0x5c) {
        i++
        const e = peek()
        if (!ESCAPES.has(e)) throw bad('in string escape code')
        i++
        if (e === 0x75) {
          for (let k = 0; k < 4; k++, i++) if (!isHex(peek())) throw bad('in \\u hexadecimal character escape')
        }
        continue
      }
      if (c < 0x20) throw bad('in string literal')
      i++
    }
  }
  const number = () => {
    if (peek() === 0x2d) {
      i++
      if (!isDigit(peek())) throw bad('in numeric literal')
    }
    if (peek() === 0x30) i++
    else digits()
    if (i < b.length && b[i] === 0x2e) {
      i++
      if (!isDigit(peek())) throw bad('after decimal point in numeric literal')
      digits()
    }
    if (i < b.length && (b[i] === 0x65 || b[i] === 0x45)) {
      i++
      if (peek() === 0x2b || peek() === 0x2d) i++
      if (!isDigit(peek())) throw bad('in exponent of numeric literal')
      digits()
    }
  }
  const literal = (word) => {
    i++
    for (const ch of word.slice(1)) {
      const want = ch.charCodeAt(0)
      if (peek() !== want) throw bad(`in literal ${word} (expecting ${quote(want)})`)
      i++
    }
  }
  const key = () => {
    ws()
    if (peek() !== 0x22) throw bad('looking for beginning of object key string')
    string()
    ws()
    if (peek() !== 0x3a) throw bad('after object key')
    i++
  }
  // One value, iteratively: nesting up to MAX_DEPTH needs no recursion.
  const scan = () => {
    const stack = []
    let wantValue = true
    for (;;) {
      if (wantValue) {
        ws()
        const c = peek()
        if (c === 0x7b || c === 0x5b) {
          if (stack.length >= MAX_DEPTH) throw bad('exceeded max depth')
          stack.push(c)
          i++
          ws()
          if (peek() === c + 2) {
            i++
            stack.pop()
            wantValue = false
          } else if (c === 0x7b) key()
          continue
        }
        if (c === 0x22) string()
        else if (c === 0x2d || isDigit(c)) number()
        else if (LITERALS[c]) literal(LITERALS[c])
        else throw bad('looking for beginning of value')
        wantValue = false
        continue
      }
      if (stack.length === 0) return
      ws()
      const c = peek()
      const top = stack[stack.length - 1]
      if (c === top + 2) {
        i++
        stack.pop()
      } else if (c === 0x2c) {
        i++
        if (top === 0x7b) key()
        wantValue = true
      } else throw bad(top === 0x7b ? 'after object key:value pair' : 'after array element')
    }
  }
  try {
    scan()
    ws()
    if (i < b.length) return 'unexpected data after the JSON value'
  } catch (e) {
    if (e instanceof Bad) return e.message
    throw e
  }
  return undefined
}
