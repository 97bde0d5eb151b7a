from cyclone.v1 import types_pb2 as _types_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetryRequest(_message.Message):
    __slots__ = ("run_id", "node", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetryResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class RetryAllRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetryAllResponse(_message.Message):
    __slots__ = ("nodes", "run")
    NODES_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    run: _types_pb2.Run
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class ResolveRequest(_message.Message):
    __slots__ = ("run_id", "node", "result", "error", "discard", "reason", "step_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DISCARD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    result: _struct_pb2.Value
    error: str
    discard: bool
    reason: str
    step_id: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[str] = ..., discard: _Optional[bool] = ..., reason: _Optional[str] = ..., step_id: _Optional[str] = ...) -> None: ...

class ResolveResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...
