// gRPC server reflection (grpc.reflection.v1 and v1alpha), so grpcurl and
// other generic clients can list and call this host's services without the
// .proto files, as on every Go dsh server.
//
// It answers from the protobuf-es descriptors in gen/ (exactly what protoc
// compiled, fully qualified names included). A file is sent together with the
// files it imports that this stream has not sent yet (as grpc-go does), so a
// client resolves a service in one round trip. Unknown files and symbols get
// NOT_FOUND in the stream, never an RPC error. (npm @grpc/reflection 1.0.4 is
// not used: it sends descriptors without their imports, grpc-node#3034.)

import * as grpc from '@grpc/grpc-js'
import { create, createRegistry, toBinary } from '@bufbuild/protobuf'
import { FileDescriptorProtoSchema } from '@bufbuild/protobuf/wkt'
import { ServerReflection, ServerReflectionResponseSchema } from '../gen/grpc/reflection/v1/reflection_pb.js'
import { grpcDefinition } from './grpcdef.js'

export const REFLECTION_SERVICES = ['grpc.reflection.v1.ServerReflection', 'grpc.reflection.v1alpha.ServerReflection']

class NotFound extends Error {}

/** The grpc-js service definition of ServerReflection under a service name (v1 and v1alpha share the messages). */
export const reflectionDefinition = (serviceName) => grpcDefinition(ServerReflection, serviceName)

/**
 * Reflection about `services` (full names) described by `files` (protobuf-es
 * DescFiles; their imports are followed). Returns grpc-js handlers.
 */
export function reflectionHandlers(services, files) {
  const byName = new Map()
  const walk = (f) => {
    if (byName.has(f.proto.name)) return
    byName.set(f.proto.name, f) // f.name lacks the .proto suffix
    f.dependencies.forEach(walk)
  }
  files.forEach(walk)
  const registry = createRegistry(...byName.values())
  const names = [...new Set([...services, ...REFLECTION_SERVICES])].sort()

  const lookup = (symbol) => {
    const dot = symbol.lastIndexOf('.')
    const service = registry.getService(symbol.slice(0, Math.max(dot, 0)))
    const d = registry.get(symbol) ?? (service?.methods.some((m) => m.name === symbol.slice(dot + 1)) ? service : undefined)
    if (!d) throw new NotFound(`symbol not found: ${symbol}`)
    return d.file
  }
  const message = (name) => {
    const d = registry.getMessage(name)
    if (!d) throw new NotFound(`message not found: ${name}`)
    return d
  }
  const filesOf = (fd, sent) => {
    const out = []
    const stack = [fd]
    while (stack.length > 0) {
      const f = stack.pop()
      if (sent.has(f.proto.name) && f !== fd) continue
      sent.add(f.proto.name)
      out.push(toBinary(FileDescriptorProtoSchema, f.proto))
      for (const d of f.dependencies) if (!sent.has(d.proto.name)) stack.push(d)
    }
    return { case: 'fileDescriptorResponse', value: { fileDescriptorProto: out } }
  }
  const answer = (req, sent) => {
    const { case: kind, value } = req.messageRequest
    switch (kind) {
      case 'listServices':
        return { case: 'listServicesResponse', value: { service: names.map((name) => ({ name })) } }
      case 'fileByFilename': {
        const f = byName.get(value)
        if (!f) throw new NotFound(`file not found: ${value}`)
        return filesOf(f, sent)
      }
      case 'fileContainingSymbol':
        return filesOf(lookup(value), sent)
      case 'fileContainingExtension': {
        const ext = registry.getExtensionFor(message(value.containingType), value.extensionNumber)
        if (!ext) throw new NotFound(`extension ${value.extensionNumber} of ${value.containingType} not found`)
        return filesOf(ext.file, sent)
      }
      case 'allExtensionNumbersOfType': {
        const m = message(value)
        const numbers = [...registry].filter((d) => d.kind === 'extension' && d.extendee.typeName === m.typeName).map((d) => d.number)
        return { case: 'allExtensionNumbersResponse', value: { baseTypeName: m.typeName, extensionNumber: numbers.sort((a, b) => a - b) } }
      }
      default:
        return { case: 'errorResponse', value: { errorCode: grpc.status.INVALID_ARGUMENT, errorMessage: 'the request names no reflection query' } }
    }
  }
  return {
    ServerReflectionInfo: (call) => {
      const sent = new Set()
      call.on('data', (req) => {
        let messageResponse
        try {
          messageResponse = answer(req, sent)
        } catch (e) {
          if (!(e instanceof NotFound)) throw e
          messageResponse = { case: 'errorResponse', value: { errorCode: grpc.status.NOT_FOUND, errorMessage: e.message } }
        }
        call.write(create(ServerReflectionResponseSchema, { validHost: req.host, originalRequest: req, messageResponse }))
      })
      call.on('end', () => call.end())
    },
  }
}
