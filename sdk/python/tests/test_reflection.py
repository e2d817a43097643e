import os
import sys
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402

from dsh_toolhost import Server, ToolHost, tool  # noqa: E402
from dsh_toolhost.gen.grpc.reflection.v1 import reflection_pb2 as pb  # noqa: E402


@tool
def noop() -> str:
    """Do nothing."""
    return ""


class ReflectionTest(unittest.TestCase):
    def setUp(self):
        self.srv = Server(ToolHost([noop])).start()
        self.ch = grpc.insecure_channel(self.srv.address)

    def tearDown(self):
        self.ch.close()
        self.srv.stop(0.5)

    def ask(self, service, *reqs):
        info = self.ch.stream_stream(f"/{service}/ServerReflectionInfo",
                                     request_serializer=pb.ServerReflectionRequest.SerializeToString,
                                     response_deserializer=pb.ServerReflectionResponse.FromString)
        return list(info(iter(reqs), timeout=10))

    def test_both_versions_list_and_resolve(self):
        for service in ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"):
            with self.subTest(service=service):
                listed, files, again = self.ask(
                    service, pb.ServerReflectionRequest(list_services=""),
                    pb.ServerReflectionRequest(file_containing_symbol="dsh.tools.v1.ToolHost.Execute"),
                    pb.ServerReflectionRequest(file_by_filename="dsh/tools/v1/tools.proto"))
                names = [s.name for s in listed.list_services_response.service]
                self.assertEqual(names, sorted(["dsh.tools.v1.ToolHost", "grpc.health.v1.Health",
                                                "grpc.reflection.v1.ServerReflection",
                                                "grpc.reflection.v1alpha.ServerReflection"]))
                protos = [descriptor_pb2.FileDescriptorProto.FromString(b)
                          for b in files.file_descriptor_response.file_descriptor_proto]
                self.assertEqual([p.name for p in protos], ["dsh/tools/v1/tools.proto", "dsh/llm/v1/llm.proto"])
                # The sent files alone build a pool that knows the service.
                pool = descriptor_pool.DescriptorPool()
                for p in reversed(protos):
                    pool.Add(p)
                method = pool.FindServiceByName("dsh.tools.v1.ToolHost").methods_by_name["Execute"]
                self.assertEqual(method.input_type.full_name, "dsh.tools.v1.ExecuteRequest")
                # Asked again on the same stream, the imports are not resent.
                self.assertEqual(len(again.file_descriptor_response.file_descriptor_proto), 1)

    def test_unknown_is_not_found_in_the_stream(self):
        reqs = [pb.ServerReflectionRequest(file_containing_symbol="dsh.nope.v1.Nothing"),
                pb.ServerReflectionRequest(file_by_filename="nope.proto"),
                pb.ServerReflectionRequest(all_extension_numbers_of_type="dsh.nope.v1.Nothing"),
                pb.ServerReflectionRequest()]
        out = self.ask("grpc.reflection.v1.ServerReflection", *reqs)
        codes = [r.error_response.error_code for r in out]
        self.assertEqual(codes, [grpc.StatusCode.NOT_FOUND.value[0]] * 3 + [grpc.StatusCode.INVALID_ARGUMENT.value[0]])
        self.assertIn("dsh.nope.v1.Nothing", out[0].error_response.error_message)


if __name__ == "__main__":
    unittest.main()
