// grpc-js service definitions from protobuf-es service descriptors (gen/),
// so clients and servers exchange the generated, typed messages.

import { create, fromBinary, toBinary } from '@bufbuild/protobuf'

/**
 * The grpc-js service definition of a protobuf-es service descriptor, under
 * its own full name or typeName (for a service served under two names, such
 * as reflection's v1 and v1alpha). Requests are created from plain init
 * objects, so callers may pass either messages or their init shapes.
 */
export function grpcDefinition(service, typeName = service.typeName) {
  const def = {}
  for (const m of service.methods) {
    def[m.name] = {
      path: `/${typeName}/${m.name}`,
      requestStream: m.methodKind === 'client_streaming' || m.methodKind === 'bidi_streaming',
      responseStream: m.methodKind === 'server_streaming' || m.methodKind === 'bidi_streaming',
      requestSerialize: (msg) => Buffer.from(toBinary(m.input, create(m.input, msg))),
      requestDeserialize: (b) => fromBinary(m.input, b),
      responseSerialize: (msg) => Buffer.from(toBinary(m.output, create(m.output, msg))),
      responseDeserialize: (b) => fromBinary(m.output, b),
      originalName: m.localName,
    }
  }
  return def
}
