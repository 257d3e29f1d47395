"""Server reflection under both names, grpc.reflection.v1 and v1alpha, with the protos' comments.

grpcio-reflection 1.85 ships only v1alpha, and answers from the descriptor pool, which holds
no source info. The two versions' messages are identical on the wire, so one servicer built on
the v1alpha messages serves both names. Files come from the descriptor set that `make protos`
(and the wheel build) writes next to the stubs with `--include_source_info --include_imports`,
so `grpcurl describe` shows each service's, RPC's and field's documentation; a file the set
lacks (health, reflection itself) is described from the pool, without comments.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import AsyncIterator, Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection_pb2 as pb

from services.common.logging import get_logger
from services.common.rpc_registry import Registrar

log = get_logger(__name__)

V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
# Written by `make protos` / the wheel build into the `serentak` package (gen/serentak/).
DESCRIPTOR_SET = "descriptors.binpb"


def load_descriptor_set() -> dict[str, bytes]:
    """Serialized FileDescriptorProtos with source info, by file name ({} when not built)."""
    try:
        data = importlib.resources.files("serentak").joinpath(DESCRIPTOR_SET).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        log.warning("reflection_without_comments", missing=f"serentak/{DESCRIPTOR_SET}")
        return {}
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return {f.name: f.SerializeToString() for f in files}


class ReflectionServicer:
    """Answers ServerReflectionInfo for the listed services (both reflection versions)."""

    def __init__(
        self,
        service_names: Iterable[str],
        files: dict[str, bytes] | None = None,
        pool: descriptor_pool.DescriptorPool | None = None,
    ) -> None:
        self._names = tuple(sorted({*service_names, V1, V1ALPHA}))
        self._files = load_descriptor_set() if files is None else files
        self._pool = pool or descriptor_pool.Default()

    async def ServerReflectionInfo(
        self, requests: AsyncIterator[pb.ServerReflectionRequest], context: object
    ) -> AsyncIterator[pb.ServerReflectionResponse]:
        """One response per request, in order."""
        async for request in requests:
            yield self._answer(request)

    def _answer(self, request: pb.ServerReflectionRequest) -> pb.ServerReflectionResponse:
        kind = request.WhichOneof("message_request")
        try:
            if kind == "file_by_filename":
                return self._file(self._pool.FindFileByName(request.file_by_filename), request)
            if kind == "file_containing_symbol":
                return self._file(self._find_symbol(request.file_containing_symbol), request)
            if kind == "file_containing_extension":
                ext = request.file_containing_extension
                message = self._pool.FindMessageTypeByName(ext.containing_type)
                extension = self._pool.FindExtensionByNumber(message, ext.extension_number)
                found = self._pool.FindFileContainingSymbol(extension.full_name)
                return self._file(found, request)
            if kind == "all_extension_numbers_of_type":
                message = self._pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in self._pool.FindAllExtensions(message))
                return pb.ServerReflectionResponse(
                    original_request=request,
                    all_extension_numbers_response=pb.ExtensionNumberResponse(
                        base_type_name=message.full_name, extension_number=numbers
                    ),
                )
            if kind == "list_services":
                services = [pb.ServiceResponse(name=n) for n in self._names]
                return pb.ServerReflectionResponse(
                    original_request=request,
                    list_services_response=pb.ListServiceResponse(service=services),
                )
        except KeyError:
            return _error(request, grpc.StatusCode.NOT_FOUND, "not found")
        return _error(request, grpc.StatusCode.INVALID_ARGUMENT, "unknown reflection request")

    def _find_symbol(self, name: str) -> FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(name)
        except KeyError:
            # The pool knows services but not their methods by full name; clients ask for both.
            service_name, _, method = name.rpartition(".")
            service = self._pool.FindServiceByName(service_name)
            if method not in service.methods_by_name:
                raise
            return service.file

    def _file(
        self, descriptor: FileDescriptor, request: pb.ServerReflectionRequest
    ) -> pb.ServerReflectionResponse:
        # The file and everything it imports, each once (protos have no import cycles).
        seen: dict[str, FileDescriptor] = {}
        todo = [descriptor]
        while todo:
            d = todo.pop()
            if d.name not in seen:
                seen[d.name] = d
                todo.extend(d.dependencies)
        protos = [self._files.get(name) or _from_pool(d) for name, d in seen.items()]
        return pb.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=pb.FileDescriptorResponse(file_descriptor_proto=protos),
        )


def _from_pool(descriptor: FileDescriptor) -> bytes:
    proto = descriptor_pb2.FileDescriptorProto()
    descriptor.CopyToProto(proto)
    return proto.SerializeToString()


def _error(
    request: pb.ServerReflectionRequest, code: grpc.StatusCode, message: str
) -> pb.ServerReflectionResponse:
    return pb.ServerReflectionResponse(
        original_request=request,
        error_response=pb.ErrorResponse(error_code=code.value[0], error_message=message),
    )


def enable_reflection(service_names: Iterable[str], server: Registrar) -> None:
    """Serves reflection for `service_names` on `server` as v1 and as v1alpha."""
    servicer = ReflectionServicer(service_names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=pb.ServerReflectionRequest.FromString,
        response_serializer=pb.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
            for name in (V1, V1ALPHA)
        ]
    )
    # Registered too, as generated code does: grpc looks these up first, and a registry
    # (rpc_registry.py) wraps them at registration rather than on first lookup.
    for name in (V1, V1ALPHA):
        server.add_registered_method_handlers(name, {"ServerReflectionInfo": handler})
