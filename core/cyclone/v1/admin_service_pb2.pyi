import datetime

from cyclone.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkflowDeadline(_message.Message):
    __slots__ = ("workflow", "deadline", "set_by", "set_at", "reason")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    SET_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    deadline: _duration_pb2.Duration
    set_by: str
    set_at: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, workflow: _Optional[str] = ..., deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., set_by: _Optional[str] = ..., set_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetWorkflowDeadlineRequest(_message.Message):
    __slots__ = ("workflow", "deadline", "reason")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    deadline: _duration_pb2.Duration
    reason: str
    def __init__(self, workflow: _Optional[str] = ..., deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetWorkflowDeadlineResponse(_message.Message):
    __slots__ = ("deadline",)
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    deadline: WorkflowDeadline
    def __init__(self, deadline: _Optional[_Union[WorkflowDeadline, _Mapping]] = ...) -> None: ...

class ClearWorkflowDeadlineRequest(_message.Message):
    __slots__ = ("workflow", "reason")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    reason: str
    def __init__(self, workflow: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ClearWorkflowDeadlineResponse(_message.Message):
    __slots__ = ("deadline",)
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    deadline: WorkflowDeadline
    def __init__(self, deadline: _Optional[_Union[WorkflowDeadline, _Mapping]] = ...) -> None: ...

class ListWorkflowDeadlinesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkflowDeadlinesResponse(_message.Message):
    __slots__ = ("deadlines",)
    DEADLINES_FIELD_NUMBER: _ClassVar[int]
    deadlines: _containers.RepeatedCompositeFieldContainer[WorkflowDeadline]
    def __init__(self, deadlines: _Optional[_Iterable[_Union[WorkflowDeadline, _Mapping]]] = ...) -> None: ...

class Build(_message.Message):
    __slots__ = ("build_id", "compatible", "workers", "pinned_nodes", "pinned_runs", "retired", "retired_at", "created_at")
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    COMPATIBLE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PINNED_NODES_FIELD_NUMBER: _ClassVar[int]
    PINNED_RUNS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    RETIRED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    build_id: str
    compatible: _containers.RepeatedScalarFieldContainer[str]
    workers: _containers.RepeatedCompositeFieldContainer[BuildWorker]
    pinned_nodes: int
    pinned_runs: int
    retired: bool
    retired_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, build_id: _Optional[str] = ..., compatible: _Optional[_Iterable[str]] = ..., workers: _Optional[_Iterable[_Union[BuildWorker, _Mapping]]] = ..., pinned_nodes: _Optional[int] = ..., pinned_runs: _Optional[int] = ..., retired: _Optional[bool] = ..., retired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BuildWorker(_message.Message):
    __slots__ = ("worker_id", "seen_at")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    seen_at: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListBuildsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBuildsResponse(_message.Message):
    __slots__ = ("builds",)
    BUILDS_FIELD_NUMBER: _ClassVar[int]
    builds: _containers.RepeatedCompositeFieldContainer[Build]
    def __init__(self, builds: _Optional[_Iterable[_Union[Build, _Mapping]]] = ...) -> None: ...

class ListBuildRunsRequest(_message.Message):
    __slots__ = ("build_id", "limit")
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    build_id: str
    limit: int
    def __init__(self, build_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class BuildRun(_message.Message):
    __slots__ = ("run_id", "workflow", "nodes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ListBuildRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[BuildRun]
    def __init__(self, runs: _Optional[_Iterable[_Union[BuildRun, _Mapping]]] = ...) -> None: ...

class SetBuildCompatibleRequest(_message.Message):
    __slots__ = ("build_id", "compatible_with", "reason")
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    COMPATIBLE_WITH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    build_id: str
    compatible_with: str
    reason: str
    def __init__(self, build_id: _Optional[str] = ..., compatible_with: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SetBuildCompatibleResponse(_message.Message):
    __slots__ = ("build",)
    BUILD_FIELD_NUMBER: _ClassVar[int]
    build: Build
    def __init__(self, build: _Optional[_Union[Build, _Mapping]] = ...) -> None: ...

class RetireBuildRequest(_message.Message):
    __slots__ = ("build_id", "reason")
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    build_id: str
    reason: str
    def __init__(self, build_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetireBuildResponse(_message.Message):
    __slots__ = ("build",)
    BUILD_FIELD_NUMBER: _ClassVar[int]
    build: Build
    def __init__(self, build: _Optional[_Union[Build, _Mapping]] = ...) -> None: ...

class MoveBuildRequest(_message.Message):
    __slots__ = ("from_build_id", "to_build_id", "reason")
    FROM_BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    TO_BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    from_build_id: str
    to_build_id: str
    reason: str
    def __init__(self, from_build_id: _Optional[str] = ..., to_build_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class MoveBuildResponse(_message.Message):
    __slots__ = ("nodes_moved", "runs_moved")
    NODES_MOVED_FIELD_NUMBER: _ClassVar[int]
    RUNS_MOVED_FIELD_NUMBER: _ClassVar[int]
    nodes_moved: int
    runs_moved: int
    def __init__(self, nodes_moved: _Optional[int] = ..., runs_moved: _Optional[int] = ...) -> None: ...

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
