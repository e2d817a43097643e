"""gRPC server reflection (``grpc.reflection.v1`` and ``v1alpha``), so that
``grpcurl`` and other generic clients can list and call a Python host's
services without the .proto files, as they can every Go dsh server.

Debian ships no grpcio-reflection, so this implements the protocol from the
descriptors the generated modules registered in protobuf's default pool. A
file is answered together with the files it imports that this stream has not
sent yet (as grpc-go does), so a client resolves a service in one round trip.
Unknown files and symbols get ``NOT_FOUND`` in the stream, never an RPC error.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import grpc
from google.protobuf import descriptor_pool

from dsh_toolhost.gen.grpc.reflection.v1 import reflection_pb2 as pb
from dsh_toolhost.gen.grpc.reflection.v1 import reflection_pb2_grpc

__all__ = ["ReflectionServicer", "add_reflection"]

SERVICE_NAMES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
_INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


class ReflectionServicer(reflection_pb2_grpc.ServerReflectionServicer):
    """Answers reflection requests about ``services`` (full names)."""

    def __init__(self, services: Iterable[str], pool=None):
        self.services = sorted(set(services))
        self.pool = pool or descriptor_pool.Default()

    def ServerReflectionInfo(self, request_iterator, context) -> Iterator[pb.ServerReflectionResponse]:
        sent: set[str] = set()
        for req in request_iterator:
            resp = pb.ServerReflectionResponse(valid_host=req.host, original_request=req)
            try:
                self._answer(req, resp, sent)
            except KeyError as e:
                resp.error_response.CopyFrom(pb.ErrorResponse(error_code=_NOT_FOUND, error_message=_unquote(e)))
            yield resp

    def _answer(self, req, resp, sent: set[str]) -> None:
        kind = req.WhichOneof("message_request")
        if kind == "list_services":
            resp.list_services_response.service.extend(pb.ServiceResponse(name=n) for n in self.services)
        elif kind == "file_by_filename":
            self._files(self.pool.FindFileByName(req.file_by_filename), resp, sent)
        elif kind == "file_containing_symbol":
            self._files(self.pool.FindFileContainingSymbol(req.file_containing_symbol), resp, sent)
        elif kind == "file_containing_extension":
            ext = req.file_containing_extension
            msg = self.pool.FindMessageTypeByName(ext.containing_type)
            self._files(self.pool.FindExtensionByNumber(msg, ext.extension_number).file, resp, sent)
        elif kind == "all_extension_numbers_of_type":
            msg = self.pool.FindMessageTypeByName(req.all_extension_numbers_of_type)
            resp.all_extension_numbers_response.base_type_name = msg.full_name
            resp.all_extension_numbers_response.extension_number.extend(
                sorted(e.number for e in self.pool.FindAllExtensions(msg)))
        else:
            resp.error_response.CopyFrom(pb.ErrorResponse(error_code=_INVALID,
                                                          error_message="the request names no reflection query"))

    def _files(self, fd, resp, sent: set[str]) -> None:
        """fd first, then its imports (transitively) not yet sent on this stream."""
        out, stack = [], [fd]
        while stack:
            f = stack.pop()
            if f.name in sent and f is not fd:
                continue
            sent.add(f.name)
            out.append(f.serialized_pb)
            stack.extend(d for d in f.dependencies if d.name not in sent)
        resp.file_descriptor_response.file_descriptor_proto.extend(out)


def _unquote(e: KeyError) -> str:
    return str(e.args[0]) if e.args else "not found"


def add_reflection(server: grpc.Server, services: Iterable[str]) -> ReflectionServicer:
    """Serve reflection for ``services`` (plus reflection itself) on ``server``,
    under both the v1 and the v1alpha service name (same messages on the wire)."""
    servicer = ReflectionServicer(list(services) + list(SERVICE_NAMES))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=pb.ServerReflectionRequest.FromString,
        response_serializer=pb.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE_NAMES[1], {"ServerReflectionInfo": handler}),))
    return servicer
