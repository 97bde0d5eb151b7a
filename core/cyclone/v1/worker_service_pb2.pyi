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

class StepCallDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_CALL_DECISION_UNSPECIFIED: _ClassVar[StepCallDecision]
    STEP_CALL_DECISION_RUN: _ClassVar[StepCallDecision]
    STEP_CALL_DECISION_RECORDED: _ClassVar[StepCallDecision]
    STEP_CALL_DECISION_UNCERTAIN: _ClassVar[StepCallDecision]

class WaitDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_DECISION_UNSPECIFIED: _ClassVar[WaitDecision]
    WAIT_DECISION_READY: _ClassVar[WaitDecision]
    WAIT_DECISION_SUSPENDED: _ClassVar[WaitDecision]
STEP_CALL_DECISION_UNSPECIFIED: StepCallDecision
STEP_CALL_DECISION_RUN: StepCallDecision
STEP_CALL_DECISION_RECORDED: StepCallDecision
STEP_CALL_DECISION_UNCERTAIN: StepCallDecision
WAIT_DECISION_UNSPECIFIED: WaitDecision
WAIT_DECISION_READY: WaitDecision
WAIT_DECISION_SUSPENDED: WaitDecision

class ActionSpec(_message.Message):
    __slots__ = ("name", "unsafe_to_repeat", "rate_limit")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_TO_REPEAT_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    unsafe_to_repeat: bool
    rate_limit: RateLimit
    def __init__(self, name: _Optional[str] = ..., unsafe_to_repeat: _Optional[bool] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ...) -> None: ...

class RateLimit(_message.Message):
    __slots__ = ("count", "period")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    count: int
    period: _duration_pb2.Duration
    def __init__(self, count: _Optional[int] = ..., period: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("worker_id", "actions", "max_steps", "wait", "lease", "build_id", "shard_node")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_NODE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    actions: _containers.RepeatedCompositeFieldContainer[ActionSpec]
    max_steps: int
    wait: _duration_pb2.Duration
    lease: _duration_pb2.Duration
    build_id: str
    shard_node: str
    def __init__(self, worker_id: _Optional[str] = ..., actions: _Optional[_Iterable[_Union[ActionSpec, _Mapping]]] = ..., max_steps: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., build_id: _Optional[str] = ..., shard_node: _Optional[str] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("steps", "blocked")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[ClaimedStep]
    blocked: _containers.RepeatedCompositeFieldContainer[BlockedStep]
    def __init__(self, steps: _Optional[_Iterable[_Union[ClaimedStep, _Mapping]]] = ..., blocked: _Optional[_Iterable[_Union[BlockedStep, _Mapping]]] = ...) -> None: ...

class BlockedStep(_message.Message):
    __slots__ = ("run_id", "node", "attempt", "step_id", "reason", "action")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    attempt: int
    step_id: str
    reason: str
    action: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., attempt: _Optional[int] = ..., step_id: _Optional[str] = ..., reason: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class ClaimedStep(_message.Message):
    __slots__ = ("run_id", "node", "action", "workflow", "attempt", "max_attempts", "input", "run_input", "upstream_outputs", "lease_token", "lease_expires_at", "deadline", "progress", "effect_uncertain", "upstream_failures", "journal", "run_deadline", "traceparent")
    class UpstreamOutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    RUN_INPUT_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EFFECT_UNCERTAIN_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FAILURES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    RUN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    action: str
    workflow: str
    attempt: int
    max_attempts: int
    input: _struct_pb2.Value
    run_input: _struct_pb2.Value
    upstream_outputs: _containers.MessageMap[str, _struct_pb2.Value]
    lease_token: str
    lease_expires_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    progress: _struct_pb2.Value
    effect_uncertain: bool
    upstream_failures: _containers.RepeatedCompositeFieldContainer[UpstreamFailure]
    journal: _containers.RepeatedCompositeFieldContainer[_types_pb2.StepCall]
    run_deadline: _timestamp_pb2.Timestamp
    traceparent: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., action: _Optional[str] = ..., workflow: _Optional[str] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., run_input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., upstream_outputs: _Optional[_Mapping[str, _struct_pb2.Value]] = ..., lease_token: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., progress: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., effect_uncertain: _Optional[bool] = ..., upstream_failures: _Optional[_Iterable[_Union[UpstreamFailure, _Mapping]]] = ..., journal: _Optional[_Iterable[_Union[_types_pb2.StepCall, _Mapping]]] = ..., run_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class UpstreamFailure(_message.Message):
    __slots__ = ("node", "status", "error")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    node: str
    status: _types_pb2.StepStatus
    error: _types_pb2.StepError
    def __init__(self, node: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.StepStatus, str]] = ..., error: _Optional[_Union[_types_pb2.StepError, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "progress", "lease", "logs")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    progress: _struct_pb2.Value
    lease: _duration_pb2.Duration
    logs: _containers.RepeatedCompositeFieldContainer[_types_pb2.LogLine]
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., progress: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., logs: _Optional[_Iterable[_Union[_types_pb2.LogLine, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_expires_at", "cancelled")
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at: _timestamp_pb2.Timestamp
    cancelled: bool
    def __init__(self, lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancelled: _Optional[bool] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "output", "failure", "logs")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    output: _struct_pb2.Value
    failure: Failure
    logs: _containers.RepeatedCompositeFieldContainer[_types_pb2.LogLine]
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., logs: _Optional[_Iterable[_Union[_types_pb2.LogLine, _Mapping]]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("message", "type", "details", "non_retryable", "retry_after", "effect_uncertain")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    NON_RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    EFFECT_UNCERTAIN_FIELD_NUMBER: _ClassVar[int]
    message: str
    type: str
    details: str
    non_retryable: bool
    retry_after: _duration_pb2.Duration
    effect_uncertain: bool
    def __init__(self, message: _Optional[str] = ..., type: _Optional[str] = ..., details: _Optional[str] = ..., non_retryable: _Optional[bool] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., effect_uncertain: _Optional[bool] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("status", "retry_at", "run_status", "duplicate")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_STATUS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    status: _types_pb2.StepStatus
    retry_at: _timestamp_pb2.Timestamp
    run_status: _types_pb2.RunStatus
    duplicate: bool
    def __init__(self, status: _Optional[_Union[_types_pb2.StepStatus, str]] = ..., retry_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_status: _Optional[_Union[_types_pb2.RunStatus, str]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class CompleteManyRequest(_message.Message):
    __slots__ = ("completions", "step_call_ends", "step_call_begins", "brief")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    STEP_CALL_ENDS_FIELD_NUMBER: _ClassVar[int]
    STEP_CALL_BEGINS_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[CompleteRequest]
    step_call_ends: _containers.RepeatedCompositeFieldContainer[EndStepCallRequest]
    step_call_begins: _containers.RepeatedCompositeFieldContainer[BeginStepCallRequest]
    brief: bool
    def __init__(self, completions: _Optional[_Iterable[_Union[CompleteRequest, _Mapping]]] = ..., step_call_ends: _Optional[_Iterable[_Union[EndStepCallRequest, _Mapping]]] = ..., step_call_begins: _Optional[_Iterable[_Union[BeginStepCallRequest, _Mapping]]] = ..., brief: _Optional[bool] = ...) -> None: ...

class CompleteManyResponse(_message.Message):
    __slots__ = ("results", "step_call_end_results", "step_call_begin_results")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STEP_CALL_END_RESULTS_FIELD_NUMBER: _ClassVar[int]
    STEP_CALL_BEGIN_RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CompleteResult]
    step_call_end_results: _containers.RepeatedCompositeFieldContainer[StepCallEndResult]
    step_call_begin_results: _containers.RepeatedCompositeFieldContainer[StepCallBeginResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CompleteResult, _Mapping]]] = ..., step_call_end_results: _Optional[_Iterable[_Union[StepCallEndResult, _Mapping]]] = ..., step_call_begin_results: _Optional[_Iterable[_Union[StepCallBeginResult, _Mapping]]] = ...) -> None: ...

class StepCallEndResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: EndStepCallResponse
    error: CompleteError
    def __init__(self, response: _Optional[_Union[EndStepCallResponse, _Mapping]] = ..., error: _Optional[_Union[CompleteError, _Mapping]] = ...) -> None: ...

class StepCallBeginResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: BeginStepCallResponse
    error: CompleteError
    def __init__(self, response: _Optional[_Union[BeginStepCallResponse, _Mapping]] = ..., error: _Optional[_Union[CompleteError, _Mapping]] = ...) -> None: ...

class CompleteResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: CompleteResponse
    error: CompleteError
    def __init__(self, response: _Optional[_Union[CompleteResponse, _Mapping]] = ..., error: _Optional[_Union[CompleteError, _Mapping]] = ...) -> None: ...

class CompleteError(_message.Message):
    __slots__ = ("code", "message", "current_attempt")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    current_attempt: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., current_attempt: _Optional[int] = ...) -> None: ...

class WorkRequest(_message.Message):
    __slots__ = ("open", "credit", "report")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    open: WorkOpen
    credit: int
    report: CompleteManyRequest
    def __init__(self, open: _Optional[_Union[WorkOpen, _Mapping]] = ..., credit: _Optional[int] = ..., report: _Optional[_Union[CompleteManyRequest, _Mapping]] = ...) -> None: ...

class WorkOpen(_message.Message):
    __slots__ = ("worker_id", "actions", "lease", "build_id", "shard_node")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_NODE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    actions: _containers.RepeatedCompositeFieldContainer[ActionSpec]
    lease: _duration_pb2.Duration
    build_id: str
    shard_node: str
    def __init__(self, worker_id: _Optional[str] = ..., actions: _Optional[_Iterable[_Union[ActionSpec, _Mapping]]] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., build_id: _Optional[str] = ..., shard_node: _Optional[str] = ...) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ("steps", "blocked", "report", "limits")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[ClaimedStep]
    blocked: _containers.RepeatedCompositeFieldContainer[BlockedStep]
    report: CompleteManyResponse
    limits: ServerLimits
    def __init__(self, steps: _Optional[_Iterable[_Union[ClaimedStep, _Mapping]]] = ..., blocked: _Optional[_Iterable[_Union[BlockedStep, _Mapping]]] = ..., report: _Optional[_Union[CompleteManyResponse, _Mapping]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_payload_bytes", "max_step_calls", "max_error_text", "max_step_call_name")
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_TEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_CALL_NAME_FIELD_NUMBER: _ClassVar[int]
    max_payload_bytes: int
    max_step_calls: int
    max_error_text: int
    max_step_call_name: int
    def __init__(self, max_payload_bytes: _Optional[int] = ..., max_step_calls: _Optional[int] = ..., max_error_text: _Optional[int] = ..., max_step_call_name: _Optional[int] = ...) -> None: ...

class BeginStepCallRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "step_id", "seq", "function", "unsafe_to_repeat", "args_digest")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_TO_REPEAT_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    function: str
    unsafe_to_repeat: bool
    args_digest: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., step_id: _Optional[str] = ..., seq: _Optional[int] = ..., function: _Optional[str] = ..., unsafe_to_repeat: _Optional[bool] = ..., args_digest: _Optional[str] = ...) -> None: ...

class BeginStepCallResponse(_message.Message):
    __slots__ = ("decision", "call", "run_status")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    RUN_STATUS_FIELD_NUMBER: _ClassVar[int]
    decision: StepCallDecision
    call: _types_pb2.StepCall
    run_status: _types_pb2.RunStatus
    def __init__(self, decision: _Optional[_Union[StepCallDecision, str]] = ..., call: _Optional[_Union[_types_pb2.StepCall, _Mapping]] = ..., run_status: _Optional[_Union[_types_pb2.RunStatus, str]] = ...) -> None: ...

class EndStepCallRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "step_id", "seq", "function", "unsafe_to_repeat", "output", "error", "args_digest")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_TO_REPEAT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    function: str
    unsafe_to_repeat: bool
    output: _struct_pb2.Value
    error: _types_pb2.StepCallError
    args_digest: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., step_id: _Optional[str] = ..., seq: _Optional[int] = ..., function: _Optional[str] = ..., unsafe_to_repeat: _Optional[bool] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.StepCallError, _Mapping]] = ..., args_digest: _Optional[str] = ...) -> None: ...

class EndStepCallResponse(_message.Message):
    __slots__ = ("call", "duplicate")
    CALL_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.StepCall
    duplicate: bool
    def __init__(self, call: _Optional[_Union[_types_pb2.StepCall, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class StartChildRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "step_id", "seq", "workflow", "input")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    workflow: _types_pb2.Workflow
    input: _struct_pb2.Value
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., step_id: _Optional[str] = ..., seq: _Optional[int] = ..., workflow: _Optional[_Union[_types_pb2.Workflow, _Mapping]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class StartChildResponse(_message.Message):
    __slots__ = ("child_run_id", "created", "call")
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    created: bool
    call: _types_pb2.StepCall
    def __init__(self, child_run_id: _Optional[str] = ..., created: _Optional[bool] = ..., call: _Optional[_Union[_types_pb2.StepCall, _Mapping]] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "step_id", "seq", "wake_at", "event", "child_run_id", "logs")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WAKE_AT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    wake_at: _timestamp_pb2.Timestamp
    event: _types_pb2.EventWait
    child_run_id: str
    logs: _containers.RepeatedCompositeFieldContainer[_types_pb2.LogLine]
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., step_id: _Optional[str] = ..., seq: _Optional[int] = ..., wake_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.EventWait, _Mapping]] = ..., child_run_id: _Optional[str] = ..., logs: _Optional[_Iterable[_Union[_types_pb2.LogLine, _Mapping]]] = ...) -> None: ...

class WaitResponse(_message.Message):
    __slots__ = ("decision", "call")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    decision: WaitDecision
    call: _types_pb2.StepCall
    def __init__(self, decision: _Optional[_Union[WaitDecision, str]] = ..., call: _Optional[_Union[_types_pb2.StepCall, _Mapping]] = ...) -> None: ...

class ChunkToEmit(_message.Message):
    __slots__ = ("stream", "step_id", "seq", "text", "json")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    stream: str
    step_id: str
    seq: int
    text: str
    json: str
    def __init__(self, stream: _Optional[str] = ..., step_id: _Optional[str] = ..., seq: _Optional[int] = ..., text: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class EmitChunksRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "chunks")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkToEmit]
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[ChunkToEmit, _Mapping]]] = ...) -> None: ...

class EmitChunksResponse(_message.Message):
    __slots__ = ("offsets", "duplicate")
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    duplicate: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, offsets: _Optional[_Iterable[int]] = ..., duplicate: _Optional[_Iterable[bool]] = ...) -> None: ...

class CreateApprovalRequest(_message.Message):
    __slots__ = ("run_id", "node", "lease_token", "step_id", "timeout", "title")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    lease_token: str
    step_id: str
    timeout: _duration_pb2.Duration
    title: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., lease_token: _Optional[str] = ..., step_id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., title: _Optional[str] = ...) -> None: ...

class CreateApprovalResponse(_message.Message):
    __slots__ = ("approval_id", "token", "url", "expires_at", "event", "decided")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    token: str
    url: str
    expires_at: _timestamp_pb2.Timestamp
    event: str
    decided: bool
    def __init__(self, approval_id: _Optional[str] = ..., token: _Optional[str] = ..., url: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event: _Optional[str] = ..., decided: _Optional[bool] = ...) -> None: ...

class InboxRequest(_message.Message):
    __slots__ = ("nodes", "answers", "published", "wait")
    NODES_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[InboxNode]
    answers: _containers.RepeatedCompositeFieldContainer[QueryAnswer]
    published: _containers.RepeatedCompositeFieldContainer[PublishedQuery]
    wait: _duration_pb2.Duration
    def __init__(self, nodes: _Optional[_Iterable[_Union[InboxNode, _Mapping]]] = ..., answers: _Optional[_Iterable[_Union[QueryAnswer, _Mapping]]] = ..., published: _Optional[_Iterable[_Union[PublishedQuery, _Mapping]]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class InboxNode(_message.Message):
    __slots__ = ("run_id", "node", "after_update")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    AFTER_UPDATE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    after_update: int
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., after_update: _Optional[int] = ...) -> None: ...

class QueryAnswer(_message.Message):
    __slots__ = ("query_id", "result", "error_type", "error_message", "run_id")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    query_id: int
    result: _struct_pb2.Value
    error_type: str
    error_message: str
    run_id: str
    def __init__(self, query_id: _Optional[int] = ..., result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class PublishedQuery(_message.Message):
    __slots__ = ("run_id", "node", "attempt", "name", "value")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    attempt: int
    name: str
    value: _struct_pb2.Value
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., attempt: _Optional[int] = ..., name: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class InboxResponse(_message.Message):
    __slots__ = ("queries", "updates")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[InboxQuery]
    updates: _containers.RepeatedCompositeFieldContainer[InboxUpdate]
    def __init__(self, queries: _Optional[_Iterable[_Union[InboxQuery, _Mapping]]] = ..., updates: _Optional[_Iterable[_Union[InboxUpdate, _Mapping]]] = ...) -> None: ...

class InboxQuery(_message.Message):
    __slots__ = ("query_id", "run_id", "node", "name", "args")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    query_id: int
    run_id: str
    node: str
    name: str
    args: _struct_pb2.ListValue
    def __init__(self, query_id: _Optional[int] = ..., run_id: _Optional[str] = ..., node: _Optional[str] = ..., name: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ...) -> None: ...

class InboxUpdate(_message.Message):
    __slots__ = ("seq", "run_id", "node", "update_id", "name", "args")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    run_id: str
    node: str
    update_id: str
    name: str
    args: _struct_pb2.ListValue
    def __init__(self, seq: _Optional[int] = ..., run_id: _Optional[str] = ..., node: _Optional[str] = ..., update_id: _Optional[str] = ..., name: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ...) -> None: ...
