import datetime

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

class TriggerRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIGGER_RULE_UNSPECIFIED: _ClassVar[TriggerRule]
    TRIGGER_RULE_ALL_SUCCESS: _ClassVar[TriggerRule]
    TRIGGER_RULE_ALL_DONE: _ClassVar[TriggerRule]
    TRIGGER_RULE_ONE_FAILED: _ClassVar[TriggerRule]

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_BLOCKED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]

class StepStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATUS_UNSPECIFIED: _ClassVar[StepStatus]
    STEP_STATUS_PENDING: _ClassVar[StepStatus]
    STEP_STATUS_AVAILABLE: _ClassVar[StepStatus]
    STEP_STATUS_RUNNING: _ClassVar[StepStatus]
    STEP_STATUS_COMPLETED: _ClassVar[StepStatus]
    STEP_STATUS_DISCARDED: _ClassVar[StepStatus]
    STEP_STATUS_UNCERTAIN: _ClassVar[StepStatus]
    STEP_STATUS_SKIPPED: _ClassVar[StepStatus]
    STEP_STATUS_CANCELLED: _ClassVar[StepStatus]

class StepCallStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_CALL_STATUS_UNSPECIFIED: _ClassVar[StepCallStatus]
    STEP_CALL_STATUS_STARTED: _ClassVar[StepCallStatus]
    STEP_CALL_STATUS_SUCCEEDED: _ClassVar[StepCallStatus]
    STEP_CALL_STATUS_FAILED: _ClassVar[StepCallStatus]
    STEP_CALL_STATUS_WAITING: _ClassVar[StepCallStatus]
    STEP_CALL_STATUS_CANCELLED: _ClassVar[StepCallStatus]

class PauseKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_KIND_UNSPECIFIED: _ClassVar[PauseKind]
    PAUSE_KIND_WORKFLOW: _ClassVar[PauseKind]
    PAUSE_KIND_ACTION: _ClassVar[PauseKind]
TRIGGER_RULE_UNSPECIFIED: TriggerRule
TRIGGER_RULE_ALL_SUCCESS: TriggerRule
TRIGGER_RULE_ALL_DONE: TriggerRule
TRIGGER_RULE_ONE_FAILED: TriggerRule
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_BLOCKED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
STEP_STATUS_UNSPECIFIED: StepStatus
STEP_STATUS_PENDING: StepStatus
STEP_STATUS_AVAILABLE: StepStatus
STEP_STATUS_RUNNING: StepStatus
STEP_STATUS_COMPLETED: StepStatus
STEP_STATUS_DISCARDED: StepStatus
STEP_STATUS_UNCERTAIN: StepStatus
STEP_STATUS_SKIPPED: StepStatus
STEP_STATUS_CANCELLED: StepStatus
STEP_CALL_STATUS_UNSPECIFIED: StepCallStatus
STEP_CALL_STATUS_STARTED: StepCallStatus
STEP_CALL_STATUS_SUCCEEDED: StepCallStatus
STEP_CALL_STATUS_FAILED: StepCallStatus
STEP_CALL_STATUS_WAITING: StepCallStatus
STEP_CALL_STATUS_CANCELLED: StepCallStatus
PAUSE_KIND_UNSPECIFIED: PauseKind
PAUSE_KIND_WORKFLOW: PauseKind
PAUSE_KIND_ACTION: PauseKind

class Workflow(_message.Message):
    __slots__ = ("name", "nodes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, name: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "action", "depends_on", "trigger_rule", "retry", "timeout", "input", "event", "priority", "concurrency")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_RULE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    name: str
    action: str
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    trigger_rule: TriggerRule
    retry: RetryPolicy
    timeout: _duration_pb2.Duration
    input: _struct_pb2.Value
    event: EventWait
    priority: int
    concurrency: ConcurrencyLimit
    def __init__(self, name: _Optional[str] = ..., action: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., trigger_rule: _Optional[_Union[TriggerRule, str]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., event: _Optional[_Union[EventWait, _Mapping]] = ..., priority: _Optional[int] = ..., concurrency: _Optional[_Union[ConcurrencyLimit, _Mapping]] = ...) -> None: ...

class EventWait(_message.Message):
    __slots__ = ("name", "timeout")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    timeout: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ConcurrencyLimit(_message.Message):
    __slots__ = ("key", "limit")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    key: str
    limit: int
    def __init__(self, key: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "initial_backoff", "max_backoff", "backoff_multiplier")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    initial_backoff: _duration_pb2.Duration
    max_backoff: _duration_pb2.Duration
    backoff_multiplier: float
    def __init__(self, max_attempts: _Optional[int] = ..., initial_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_multiplier: _Optional[float] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "workflow", "status", "input", "error", "submit_key", "created_at", "updated_at", "finished_at", "steps", "audit", "step_counts", "parent_run_id", "parent_node", "parent_step_id", "priority", "start_at", "tags", "deadline", "pause")
    class StepCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNTS_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_NODE_FIELD_NUMBER: _ClassVar[int]
    PARENT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow: str
    status: RunStatus
    input: _struct_pb2.Value
    error: RunError
    submit_key: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    audit: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    step_counts: _containers.ScalarMap[str, int]
    parent_run_id: str
    parent_node: str
    parent_step_id: str
    priority: int
    start_at: _timestamp_pb2.Timestamp
    tags: _containers.ScalarMap[str, str]
    deadline: _timestamp_pb2.Timestamp
    pause: RunPause
    def __init__(self, run_id: _Optional[str] = ..., workflow: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[RunError, _Mapping]] = ..., submit_key: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., audit: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., step_counts: _Optional[_Mapping[str, int]] = ..., parent_run_id: _Optional[str] = ..., parent_node: _Optional[str] = ..., parent_step_id: _Optional[str] = ..., priority: _Optional[int] = ..., start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tags: _Optional[_Mapping[str, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pause: _Optional[_Union[RunPause, _Mapping]] = ...) -> None: ...

class RunError(_message.Message):
    __slots__ = ("kind", "message", "node", "attempt", "started_at", "step_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    node: str
    attempt: int
    started_at: _timestamp_pb2.Timestamp
    step_id: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., node: _Optional[str] = ..., attempt: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., step_id: _Optional[str] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("node", "action", "status", "attempt", "max_attempts", "depends_on", "trigger_rule", "input", "output", "errors", "worker_id", "lease_expires_at", "available_at", "started_at", "finished_at", "effect_uncertain", "timeout", "progress", "last_heartbeat_at", "journal", "resumes", "waiting_for", "priority", "concurrency_key", "logs", "recoveries", "max_recoveries", "build_id", "retry", "concurrency_limit", "waiting", "waiting_reason", "waiting_until", "unsafe")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_RULE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EFFECT_UNCERTAIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    RESUMES_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    WAITING_UNTIL_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_FIELD_NUMBER: _ClassVar[int]
    node: str
    action: str
    status: StepStatus
    attempt: int
    max_attempts: int
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    trigger_rule: TriggerRule
    input: _struct_pb2.Value
    output: _struct_pb2.Value
    errors: _containers.RepeatedCompositeFieldContainer[StepError]
    worker_id: str
    lease_expires_at: _timestamp_pb2.Timestamp
    available_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    effect_uncertain: bool
    timeout: _duration_pb2.Duration
    progress: _struct_pb2.Value
    last_heartbeat_at: _timestamp_pb2.Timestamp
    journal: _containers.RepeatedCompositeFieldContainer[StepCall]
    resumes: int
    waiting_for: str
    priority: int
    concurrency_key: str
    logs: _containers.RepeatedCompositeFieldContainer[LogLine]
    recoveries: int
    max_recoveries: int
    build_id: str
    retry: RetryPolicy
    concurrency_limit: int
    waiting: str
    waiting_reason: str
    waiting_until: _timestamp_pb2.Timestamp
    unsafe: bool
    def __init__(self, node: _Optional[str] = ..., action: _Optional[str] = ..., status: _Optional[_Union[StepStatus, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., depends_on: _Optional[_Iterable[str]] = ..., trigger_rule: _Optional[_Union[TriggerRule, str]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., errors: _Optional[_Iterable[_Union[StepError, _Mapping]]] = ..., worker_id: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., available_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., effect_uncertain: _Optional[bool] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., progress: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., last_heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., journal: _Optional[_Iterable[_Union[StepCall, _Mapping]]] = ..., resumes: _Optional[int] = ..., waiting_for: _Optional[str] = ..., priority: _Optional[int] = ..., concurrency_key: _Optional[str] = ..., logs: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., recoveries: _Optional[int] = ..., max_recoveries: _Optional[int] = ..., build_id: _Optional[str] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., concurrency_limit: _Optional[int] = ..., waiting: _Optional[str] = ..., waiting_reason: _Optional[str] = ..., waiting_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., unsafe: _Optional[bool] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("at", "level", "message", "attempt", "logger")
    AT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LOGGER_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    level: str
    message: str
    attempt: int
    logger: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., level: _Optional[str] = ..., message: _Optional[str] = ..., attempt: _Optional[int] = ..., logger: _Optional[str] = ...) -> None: ...

class StepCall(_message.Message):
    __slots__ = ("step_id", "seq", "function", "status", "unsafe_to_repeat", "output", "error", "attempt", "started_at", "finished_at", "wake_at", "waiting_for", "args_digest")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_TO_REPEAT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    WAKE_AT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    seq: int
    function: str
    status: StepCallStatus
    unsafe_to_repeat: bool
    output: _struct_pb2.Value
    error: StepCallError
    attempt: int
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    wake_at: _timestamp_pb2.Timestamp
    waiting_for: str
    args_digest: str
    def __init__(self, step_id: _Optional[str] = ..., seq: _Optional[int] = ..., function: _Optional[str] = ..., status: _Optional[_Union[StepCallStatus, str]] = ..., unsafe_to_repeat: _Optional[bool] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[StepCallError, _Mapping]] = ..., attempt: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., wake_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., waiting_for: _Optional[str] = ..., args_digest: _Optional[str] = ...) -> None: ...

class StepCallError(_message.Message):
    __slots__ = ("type", "message", "details", "module", "args", "attributes")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    details: str
    module: str
    args: _struct_pb2.Value
    attributes: _struct_pb2.Value
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[str] = ..., module: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., attributes: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class StepError(_message.Message):
    __slots__ = ("attempt", "kind", "type", "message", "details", "retryable", "at")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    kind: str
    type: str
    message: str
    details: str
    retryable: bool
    at: _timestamp_pb2.Timestamp
    def __init__(self, attempt: _Optional[int] = ..., kind: _Optional[str] = ..., type: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[str] = ..., retryable: _Optional[bool] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RunPause(_message.Message):
    __slots__ = ("actor", "reason", "at")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    actor: str
    reason: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, actor: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Pause(_message.Message):
    __slots__ = ("kind", "name", "pause")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    kind: PauseKind
    name: str
    pause: RunPause
    def __init__(self, kind: _Optional[_Union[PauseKind, str]] = ..., name: _Optional[str] = ..., pause: _Optional[_Union[RunPause, _Mapping]] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("action", "node", "actor", "reason", "at", "details")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    action: str
    node: str
    actor: str
    reason: str
    at: _timestamp_pb2.Timestamp
    details: _struct_pb2.Value
    def __init__(self, action: _Optional[str] = ..., node: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., details: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
