"""Server reflection that keeps the proto comments.

The generated Python descriptors carry no comments, so stock reflection would make
``grpcurl describe`` show bare signatures. ``make proto`` also writes a descriptor set
with source info (cyclone.binpb); files found there are served from it, so describe
shows each RPC's and field's documentation.

It overrides private methods of grpc-reflection's servicer (pinned by the server
extra); their names are not in its type stubs, hence the few type: ignore below.
"""

from __future__ import annotations

from importlib import resources

from google.protobuf import descriptor, descriptor_pb2
from grpc_reflection.v1alpha import _async, _base
from grpc_reflection.v1alpha import reflection_pb2 as pb


def _documented_files() -> dict[str, bytes]:
    raw = resources.files("cyclone.v1").joinpath("cyclone.binpb").read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(raw).file
    return {f.name: f.SerializeToString() for f in files}


class DocumentedReflectionServicer(_async.ReflectionServicer):
    def __init__(self, service_names: tuple[str, ...]) -> None:
        super().__init__(service_names)
        self._documented = _documented_files()

    def _respond(
        self, file: descriptor.FileDescriptor, request: pb.ServerReflectionRequest
    ) -> pb.ServerReflectionResponse:
        files: dict[str, descriptor.FileDescriptor] = {}
        _base._collect_transitive_dependencies(file, files)  # type: ignore[attr-defined]
        serialized = []
        for name, dependency in files.items():
            if name in self._documented:
                serialized.append(self._documented[name])
            else:
                proto = descriptor_pb2.FileDescriptorProto()
                dependency.CopyToProto(proto)
                serialized.append(proto.SerializeToString())
        return pb.ServerReflectionResponse(
            file_descriptor_response=pb.FileDescriptorResponse(file_descriptor_proto=serialized),
            original_request=request,
        )

    def _file_by_filename(
        self, request: pb.ServerReflectionRequest, filename: str
    ) -> pb.ServerReflectionResponse:
        try:
            return self._respond(self._pool.FindFileByName(filename), request)  # type: ignore[attr-defined]
        except KeyError:
            return _base._not_found_error(request)  # type: ignore[attr-defined,no-any-return]

    def _file_containing_symbol(
        self, request: pb.ServerReflectionRequest, fully_qualified_name: str
    ) -> pb.ServerReflectionResponse:
        # The pool does not index methods: `describe Service.Method` asks for one, so
        # fall back to the enclosing symbol.
        name = fully_qualified_name
        while name:
            try:
                found = self._pool.FindFileContainingSymbol(name)  # type: ignore[attr-defined]
                return self._respond(found, request)
            except KeyError:
                name = name.rpartition(".")[0]
        return _base._not_found_error(request)  # type: ignore[attr-defined,no-any-return]
