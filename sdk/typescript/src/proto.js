// Loads the dsh protos at runtime (no code generation, so nothing can drift):
// from $DSH_PROTO_DIR, else ../../../proto relative to this file (the repo's
// proto/ folder), plus the vendored grpc health protocol.
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import * as grpc from '@grpc/grpc-js'
import * as protoLoader from '@grpc/proto-loader'

const here = path.dirname(fileURLToPath(import.meta.url))

/** Options shared by every loader: camelCase fields, enums and int64 as strings, oneof discriminators. */
export const LOADER_OPTIONS = { longs: String, enums: String, defaults: true, oneofs: true }

let cached
/** @returns {{tools: any, health: any, definition: object}} the loaded gRPC package objects and their proto-loader definition (for reflection) */
export function loadProtos() {
  if (cached) return cached
  const protoDir = process.env.DSH_PROTO_DIR || path.resolve(here, '..', '..', '..', 'proto')
  const localDir = path.resolve(here, '..', 'proto')
  const def = protoLoader.loadSync(['dsh/tools/v1/tools.proto', 'grpc/health/v1/health.proto'], {
    ...LOADER_OPTIONS,
    includeDirs: [protoDir, localDir],
  })
  const pkg = grpc.loadPackageDefinition(def)
  cached = { tools: pkg.dsh.tools.v1, health: pkg.grpc.health.v1, definition: def }
  return cached
}
