import datetime

from cyclone.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExplainReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPLAIN_REASON_UNSPECIFIED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_WAITING_ON_UPSTREAM: _ClassVar[ExplainReason]
    EXPLAIN_REASON_BACKING_OFF: _ClassVar[ExplainReason]
    EXPLAIN_REASON_READY: _ClassVar[ExplainReason]
    EXPLAIN_REASON_QUEUED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_NO_WORKER: _ClassVar[ExplainReason]
    EXPLAIN_REASON_RUNNING: _ClassVar[ExplainReason]
    EXPLAIN_REASON_LEASE_EXPIRED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_BLOCKED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_DISCARDED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_SKIPPED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_CANCELLED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_COMPLETED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_CONCURRENCY_LIMITED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_RATE_LIMITED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_WAITING: _ClassVar[ExplainReason]
    EXPLAIN_REASON_NOT_BEFORE: _ClassVar[ExplainReason]
    EXPLAIN_REASON_PAUSED: _ClassVar[ExplainReason]
EXPLAIN_REASON_UNSPECIFIED: ExplainReason
EXPLAIN_REASON_WAITING_ON_UPSTREAM: ExplainReason
EXPLAIN_REASON_BACKING_OFF: ExplainReason
EXPLAIN_REASON_READY: ExplainReason
EXPLAIN_REASON_QUEUED: ExplainReason
EXPLAIN_REASON_NO_WORKER: ExplainReason
EXPLAIN_REASON_RUNNING: ExplainReason
EXPLAIN_REASON_LEASE_EXPIRED: ExplainReason
EXPLAIN_REASON_BLOCKED: ExplainReason
EXPLAIN_REASON_DISCARDED: ExplainReason
EXPLAIN_REASON_SKIPPED: ExplainReason
EXPLAIN_REASON_CANCELLED: ExplainReason
EXPLAIN_REASON_COMPLETED: ExplainReason
EXPLAIN_REASON_CONCURRENCY_LIMITED: ExplainReason
EXPLAIN_REASON_RATE_LIMITED: ExplainReason
EXPLAIN_REASON_WAITING: ExplainReason
EXPLAIN_REASON_NOT_BEFORE: ExplainReason
EXPLAIN_REASON_PAUSED: ExplainReason

class SubmitRequest(_message.Message):
    __slots__ = ("workflow", "input", "start_at", "priority", "tags", "deadline")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    workflow: _types_pb2.Workflow
    input: _struct_pb2.Value
    start_at: _timestamp_pb2.Timestamp
    priority: int
    tags: _containers.ScalarMap[str, str]
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, workflow: _Optional[_Union[_types_pb2.Workflow, _Mapping]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., tags: _Optional[_Mapping[str, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class SubmitOnceRequest(_message.Message):
    __slots__ = ("workflow", "input", "key", "start_at", "priority", "tags", "deadline")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    workflow: _types_pb2.Workflow
    input: _struct_pb2.Value
    key: str
    start_at: _timestamp_pb2.Timestamp
    priority: int
    tags: _containers.ScalarMap[str, str]
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, workflow: _Optional[_Union[_types_pb2.Workflow, _Mapping]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., key: _Optional[str] = ..., start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., tags: _Optional[_Mapping[str, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitOnceResponse(_message.Message):
    __slots__ = ("run_id", "created")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created: bool
    def __init__(self, run_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id", "logs", "logs_node")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    LOGS_NODE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    logs: bool
    logs_node: str
    def __init__(self, run_id: _Optional[str] = ..., logs: _Optional[bool] = ..., logs_node: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("workflow", "statuses", "created_after", "created_before", "page_size", "page_token", "key", "run_id_prefix", "workflow_prefix", "key_prefix", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_PREFIX_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    statuses: _containers.RepeatedScalarFieldContainer[_types_pb2.RunStatus]
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    key: str
    run_id_prefix: str
    workflow_prefix: str
    key_prefix: str
    tags: _containers.ScalarMap[str, str]
    def __init__(self, workflow: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_types_pb2.RunStatus, str]]] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., key: _Optional[str] = ..., run_id_prefix: _Optional[str] = ..., workflow_prefix: _Optional[str] = ..., key_prefix: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token", "prev_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREV_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Run]
    next_page_token: str
    prev_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_types_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., prev_page_token: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason", "keep_children")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    keep_children: bool
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., keep_children: _Optional[bool] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("run_id", "node")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("reason", "message", "step", "run_status", "run_error", "upstream", "action")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RUN_STATUS_FIELD_NUMBER: _ClassVar[int]
    RUN_ERROR_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    reason: ExplainReason
    message: str
    step: _types_pb2.Step
    run_status: _types_pb2.RunStatus
    run_error: _types_pb2.RunError
    upstream: _containers.RepeatedCompositeFieldContainer[NodeState]
    action: ActionActivity
    def __init__(self, reason: _Optional[_Union[ExplainReason, str]] = ..., message: _Optional[str] = ..., step: _Optional[_Union[_types_pb2.Step, _Mapping]] = ..., run_status: _Optional[_Union[_types_pb2.RunStatus, str]] = ..., run_error: _Optional[_Union[_types_pb2.RunError, _Mapping]] = ..., upstream: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ..., action: _Optional[_Union[ActionActivity, _Mapping]] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("node", "status", "attempt", "last_error")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    node: str
    status: _types_pb2.StepStatus
    attempt: int
    last_error: _types_pb2.StepError
    def __init__(self, node: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.StepStatus, str]] = ..., attempt: _Optional[int] = ..., last_error: _Optional[_Union[_types_pb2.StepError, _Mapping]] = ...) -> None: ...

class ActionActivity(_message.Message):
    __slots__ = ("action", "last_polled_at", "last_polled_by", "last_claimed_at", "last_claimed_by", "ready_ahead", "running", "served_by_server")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    LAST_POLLED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_POLLED_BY_FIELD_NUMBER: _ClassVar[int]
    LAST_CLAIMED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_CLAIMED_BY_FIELD_NUMBER: _ClassVar[int]
    READY_AHEAD_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_SERVER_FIELD_NUMBER: _ClassVar[int]
    action: str
    last_polled_at: _timestamp_pb2.Timestamp
    last_polled_by: str
    last_claimed_at: _timestamp_pb2.Timestamp
    last_claimed_by: str
    ready_ahead: int
    running: int
    served_by_server: bool
    def __init__(self, action: _Optional[str] = ..., last_polled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_polled_by: _Optional[str] = ..., last_claimed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_claimed_by: _Optional[str] = ..., ready_ahead: _Optional[int] = ..., running: _Optional[int] = ..., served_by_server: _Optional[bool] = ...) -> None: ...

class SendEventRequest(_message.Message):
    __slots__ = ("run_id", "name", "payload", "key")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    payload: _struct_pb2.Value
    key: str
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class SendEventResponse(_message.Message):
    __slots__ = ("event_id", "created")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    created: bool
    def __init__(self, event_id: _Optional[int] = ..., created: _Optional[bool] = ...) -> None: ...

class CountRunsRequest(_message.Message):
    __slots__ = ("workflow", "statuses", "created_after", "created_before", "key", "limit", "run_id_prefix", "workflow_prefix", "key_prefix", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_PREFIX_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    statuses: _containers.RepeatedScalarFieldContainer[_types_pb2.RunStatus]
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    key: str
    limit: int
    run_id_prefix: str
    workflow_prefix: str
    key_prefix: str
    tags: _containers.ScalarMap[str, str]
    def __init__(self, workflow: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_types_pb2.RunStatus, str]]] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., key: _Optional[str] = ..., limit: _Optional[int] = ..., run_id_prefix: _Optional[str] = ..., workflow_prefix: _Optional[str] = ..., key_prefix: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CountRunsResponse(_message.Message):
    __slots__ = ("counts",)
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[RunCount]
    def __init__(self, counts: _Optional[_Iterable[_Union[RunCount, _Mapping]]] = ...) -> None: ...

class RunCount(_message.Message):
    __slots__ = ("status", "count", "at_least")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    status: _types_pb2.RunStatus
    count: int
    at_least: bool
    def __init__(self, status: _Optional[_Union[_types_pb2.RunStatus, str]] = ..., count: _Optional[int] = ..., at_least: _Optional[bool] = ...) -> None: ...

class ListStepsRequest(_message.Message):
    __slots__ = ("status", "lease_expired", "backing_off", "worker_id", "action", "page_size", "page_token", "ready")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    BACKING_OFF_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    status: _types_pb2.StepStatus
    lease_expired: bool
    backing_off: bool
    worker_id: str
    action: str
    page_size: int
    page_token: str
    ready: bool
    def __init__(self, status: _Optional[_Union[_types_pb2.StepStatus, str]] = ..., lease_expired: _Optional[bool] = ..., backing_off: _Optional[bool] = ..., worker_id: _Optional[str] = ..., action: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., ready: _Optional[bool] = ...) -> None: ...

class ListStepsResponse(_message.Message):
    __slots__ = ("steps", "next_page_token")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[RunStep]
    next_page_token: str
    def __init__(self, steps: _Optional[_Iterable[_Union[RunStep, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RunStep(_message.Message):
    __slots__ = ("run_id", "workflow", "step")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    step: _types_pb2.Step
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., step: _Optional[_Union[_types_pb2.Step, _Mapping]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers", "actions")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerSummary]
    actions: _containers.RepeatedCompositeFieldContainer[ActionActivity]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerSummary, _Mapping]]] = ..., actions: _Optional[_Iterable[_Union[ActionActivity, _Mapping]]] = ...) -> None: ...

class WorkerSummary(_message.Message):
    __slots__ = ("worker_id", "actions", "running", "last_heartbeat_at", "lease_expired", "unhealthy", "unhealthy_since", "build_id", "last_seen_at", "serves")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_SINCE_FIELD_NUMBER: _ClassVar[int]
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    SERVES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    running: int
    last_heartbeat_at: _timestamp_pb2.Timestamp
    lease_expired: int
    unhealthy: bool
    unhealthy_since: _timestamp_pb2.Timestamp
    build_id: str
    last_seen_at: _timestamp_pb2.Timestamp
    serves: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., running: _Optional[int] = ..., last_heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expired: _Optional[int] = ..., unhealthy: _Optional[bool] = ..., unhealthy_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., build_id: _Optional[str] = ..., last_seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., serves: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadStreamRequest(_message.Message):
    __slots__ = ("run_id", "stream", "from_offset", "no_wait")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    stream: str
    from_offset: int
    no_wait: bool
    def __init__(self, run_id: _Optional[str] = ..., stream: _Optional[str] = ..., from_offset: _Optional[int] = ..., no_wait: _Optional[bool] = ...) -> None: ...

class ReadStreamResponse(_message.Message):
    __slots__ = ("offset", "node", "step_id", "attempt", "emitted_at", "text", "json")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    EMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    offset: int
    node: str
    step_id: str
    attempt: int
    emitted_at: _timestamp_pb2.Timestamp
    text: str
    json: str
    def __init__(self, offset: _Optional[int] = ..., node: _Optional[str] = ..., step_id: _Optional[str] = ..., attempt: _Optional[int] = ..., emitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class ListStreamsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListStreamsResponse(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamSummary]
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamSummary, _Mapping]]] = ...) -> None: ...

class StreamSummary(_message.Message):
    __slots__ = ("name", "chunks", "bytes", "last_emitted_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_EMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    chunks: int
    bytes: int
    last_emitted_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., chunks: _Optional[int] = ..., bytes: _Optional[int] = ..., last_emitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class QueryRunRequest(_message.Message):
    __slots__ = ("run_id", "node", "name", "args", "timeout")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    name: str
    args: _struct_pb2.ListValue
    timeout: _duration_pb2.Duration
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., name: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class QueryRunResponse(_message.Message):
    __slots__ = ("result", "published", "published_at")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    result: _struct_pb2.Value
    published: bool
    published_at: _timestamp_pb2.Timestamp
    def __init__(self, result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., published: _Optional[bool] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UpdateRunRequest(_message.Message):
    __slots__ = ("run_id", "node", "name", "args", "update_id", "timeout")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    name: str
    args: _struct_pb2.ListValue
    update_id: str
    timeout: _duration_pb2.Duration
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., name: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ..., update_id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class UpdateRunResponse(_message.Message):
    __slots__ = ("result", "update_id", "created", "seq")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    result: _struct_pb2.Value
    update_id: str
    created: bool
    seq: int
    def __init__(self, result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., update_id: _Optional[str] = ..., created: _Optional[bool] = ..., seq: _Optional[int] = ...) -> None: ...
