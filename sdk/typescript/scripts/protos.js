// `node scripts/protos.js bundle` copies the dsh protos (../../proto/dsh) into
// proto/dsh so `npm pack` ships them (the runtime loader finds them there, no
// DSH_PROTO_DIR needed); `clean` removes the copy after packing, so the
// checkout keeps loading ../../proto.
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const src = path.resolve(pkg, '..', '..', 'proto', 'dsh')
const dst = path.join(pkg, 'proto', 'dsh')

fs.rmSync(dst, { recursive: true, force: true })
if (process.argv[2] === 'bundle') {
  if (!fs.existsSync(src)) throw new Error(`protos.js: ${src} not found: pack from a dsh checkout`)
  fs.cpSync(src, dst, { recursive: true, filter: (f) => fs.statSync(f).isDirectory() || f.endsWith('.proto') })
}
