// Loads the dsh protos at runtime for the toolhost server: from $DSH_PROTO_DIR,
// else the package's own proto/ (an installed package carries proto/dsh,
// copied by `npm pack`), else ../../../proto relative to this file (the
// repository's proto/ folder in a checkout), plus the vendored grpc health
// protocol. (Clients use the generated protobuf-es messages in gen/.)
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
  const localDir = path.resolve(here, '..', 'proto')
  const repoDir = path.resolve(here, '..', '..', '..', 'proto')
  const def = protoLoader.loadSync(['dsh/tools/v1/tools.proto', 'grpc/health/v1/health.proto'], {
    ...LOADER_OPTIONS,
    includeDirs: [process.env.DSH_PROTO_DIR, localDir, repoDir].filter(Boolean),
  })
  const pkg = grpc.loadPackageDefinition(def)
  cached = { tools: pkg.dsh.tools.v1, health: pkg.grpc.health.v1, definition: def }
  return cached
}
