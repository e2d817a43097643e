import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as grpc from '@grpc/grpc-js'
import { create, createFileRegistry, fromBinary } from '@bufbuild/protobuf'
import { FileDescriptorProtoSchema } from '@bufbuild/protobuf/wkt'
import { ServerReflectionRequestSchema } from '../gen/grpc/reflection/v1/reflection_pb.js'
import { reflectionDefinition } from '../src/reflection.js'
import { defineTool, ToolHost, Server } from '../src/index.js'

const noop = defineTool({ name: 'noop', execute: () => '' })

async function ask(addr, service, reqs) {
  const Client = grpc.makeGenericClientConstructor(reflectionDefinition(service), 'ServerReflection')
  const client = new Client(addr, grpc.credentials.createInsecure())
  const call = client.ServerReflectionInfo()
  const out = []
  call.on('data', (m) => out.push(m))
  for (const r of reqs) call.write(create(ServerReflectionRequestSchema, r))
  call.end()
  await new Promise((resolve, reject) => {
    call.on('end', resolve)
    call.on('error', reject)
  })
  client.close()
  return out
}

test('reflection v1 and v1alpha list and resolve the services with their imports', async () => {
  const srv = new Server({ host: new ToolHost([noop]) })
  const addr = await srv.listen('127.0.0.1:0')
  try {
    for (const service of ['grpc.reflection.v1.ServerReflection', 'grpc.reflection.v1alpha.ServerReflection']) {
      const [listed, files, again, missing] = await ask(addr, service, [
        { messageRequest: { case: 'listServices', value: '' } },
        { messageRequest: { case: 'fileContainingSymbol', value: 'dsh.tools.v1.ToolHost.Execute' } },
        { messageRequest: { case: 'fileByFilename', value: 'dsh/tools/v1/tools.proto' } },
        { messageRequest: { case: 'fileContainingSymbol', value: 'dsh.nope.v1.Nothing' } },
      ])
      assert.deepEqual(listed.messageResponse.value.service.map((s) => s.name), [
        'dsh.tools.v1.ToolHost', 'grpc.health.v1.Health', 'grpc.reflection.v1.ServerReflection', 'grpc.reflection.v1alpha.ServerReflection'])
      const protos = files.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b))
      assert.deepEqual(protos.map((p) => p.name), ['dsh/tools/v1/tools.proto', 'dsh/llm/v1/llm.proto'], service)
      // The sent files alone resolve the service (every import was sent, names are fully qualified).
      const byName = new Map(protos.map((p) => [p.name, p]))
      const reg = createFileRegistry(protos[0], (name) => byName.get(name))
      assert.equal(reg.getService('dsh.tools.v1.ToolHost').methods.find((m) => m.name === 'Execute').input.typeName, 'dsh.tools.v1.ExecuteRequest')
      assert.equal(again.messageResponse.value.fileDescriptorProto.length, 1, 'imports already sent on this stream are not resent')
      assert.equal(missing.messageResponse.case, 'errorResponse')
      assert.equal(missing.messageResponse.value.errorCode, grpc.status.NOT_FOUND)
    }
  } finally {
    await srv.stop(100)
  }
})
