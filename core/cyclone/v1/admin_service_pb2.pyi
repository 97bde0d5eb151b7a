import datetime

from cyclone.v1 import types_pb2 as _types_pb2
from cyclone.v1 import workflow_service_pb2 as _workflow_service_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BulkActionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BULK_ACTION_KIND_UNSPECIFIED: _ClassVar[BulkActionKind]
    BULK_ACTION_KIND_CANCEL: _ClassVar[BulkActionKind]
    BULK_ACTION_KIND_RETRY: _ClassVar[BulkActionKind]
    BULK_ACTION_KIND_RESOLVE_DISCARD: _ClassVar[BulkActionKind]

class BulkActionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BULK_ACTION_STATE_UNSPECIFIED: _ClassVar[BulkActionState]
    BULK_ACTION_STATE_RUNNING: _ClassVar[BulkActionState]
    BULK_ACTION_STATE_DONE: _ClassVar[BulkActionState]
    BULK_ACTION_STATE_CANCELLED: _ClassVar[BulkActionState]
BULK_ACTION_KIND_UNSPECIFIED: BulkActionKind
BULK_ACTION_KIND_CANCEL: BulkActionKind
BULK_ACTION_KIND_RETRY: BulkActionKind
BULK_ACTION_KIND_RESOLVE_DISCARD: BulkActionKind
BULK_ACTION_STATE_UNSPECIFIED: BulkActionState
BULK_ACTION_STATE_RUNNING: BulkActionState
BULK_ACTION_STATE_DONE: BulkActionState
BULK_ACTION_STATE_CANCELLED: BulkActionState

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

class PauseRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseRunResponse(_message.Message):
    __slots__ = ("run", "changed")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    changed: bool
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeRunResponse(_message.Message):
    __slots__ = ("run", "changed")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    changed: bool
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class PauseWorkflowRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseWorkflowResponse(_message.Message):
    __slots__ = ("changed", "pause")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    pause: _types_pb2.RunPause
    def __init__(self, changed: _Optional[bool] = ..., pause: _Optional[_Union[_types_pb2.RunPause, _Mapping]] = ...) -> None: ...

class ResumeWorkflowRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeWorkflowResponse(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    def __init__(self, changed: _Optional[bool] = ...) -> None: ...

class PauseActionRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseActionResponse(_message.Message):
    __slots__ = ("changed", "pause")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    pause: _types_pb2.RunPause
    def __init__(self, changed: _Optional[bool] = ..., pause: _Optional[_Union[_types_pb2.RunPause, _Mapping]] = ...) -> None: ...

class ResumeActionRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeActionResponse(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    def __init__(self, changed: _Optional[bool] = ...) -> None: ...

class ListPausesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPausesResponse(_message.Message):
    __slots__ = ("pauses",)
    PAUSES_FIELD_NUMBER: _ClassVar[int]
    pauses: _containers.RepeatedCompositeFieldContainer[_types_pb2.Pause]
    def __init__(self, pauses: _Optional[_Iterable[_Union[_types_pb2.Pause, _Mapping]]] = ...) -> None: ...

class BulkAction(_message.Message):
    __slots__ = ("job_id", "action", "filter", "reason", "actor", "state", "total", "total_at_least", "touched", "skipped", "failed", "last_error", "cancelled_by", "created_at", "updated_at", "finished_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOTAL_AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    TOUCHED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    action: BulkActionKind
    filter: _workflow_service_pb2.ListRunsRequest
    reason: str
    actor: str
    state: BulkActionState
    total: int
    total_at_least: bool
    touched: int
    skipped: int
    failed: int
    last_error: str
    cancelled_by: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., action: _Optional[_Union[BulkActionKind, str]] = ..., filter: _Optional[_Union[_workflow_service_pb2.ListRunsRequest, _Mapping]] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., state: _Optional[_Union[BulkActionState, str]] = ..., total: _Optional[int] = ..., total_at_least: _Optional[bool] = ..., touched: _Optional[int] = ..., skipped: _Optional[int] = ..., failed: _Optional[int] = ..., last_error: _Optional[str] = ..., cancelled_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StartBulkActionRequest(_message.Message):
    __slots__ = ("action", "filter", "reason", "dry_run", "confirm_all")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_ALL_FIELD_NUMBER: _ClassVar[int]
    action: BulkActionKind
    filter: _workflow_service_pb2.ListRunsRequest
    reason: str
    dry_run: bool
    confirm_all: bool
    def __init__(self, action: _Optional[_Union[BulkActionKind, str]] = ..., filter: _Optional[_Union[_workflow_service_pb2.ListRunsRequest, _Mapping]] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., confirm_all: _Optional[bool] = ...) -> None: ...

class StartBulkActionResponse(_message.Message):
    __slots__ = ("job", "matched", "matched_at_least")
    JOB_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    MATCHED_AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    job: BulkAction
    matched: int
    matched_at_least: bool
    def __init__(self, job: _Optional[_Union[BulkAction, _Mapping]] = ..., matched: _Optional[int] = ..., matched_at_least: _Optional[bool] = ...) -> None: ...

class GetBulkActionRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetBulkActionResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: BulkAction
    def __init__(self, job: _Optional[_Union[BulkAction, _Mapping]] = ...) -> None: ...

class ListBulkActionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBulkActionsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[BulkAction]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[BulkAction, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelBulkActionRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelBulkActionResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: BulkAction
    def __init__(self, job: _Optional[_Union[BulkAction, _Mapping]] = ...) -> None: ...

class SetRunTagsRequest(_message.Message):
    __slots__ = ("run_id", "set_tags", "remove_keys", "reason")
    class SetTagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SET_TAGS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_KEYS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    set_tags: _containers.ScalarMap[str, str]
    remove_keys: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., set_tags: _Optional[_Mapping[str, str]] = ..., remove_keys: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetRunTagsResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("approval_id", "run_id", "node", "step_id", "title", "created_at", "expires_at", "decided_at", "decided_by", "decision", "workflow")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    run_id: str
    node: str
    step_id: str
    title: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    decided_at: _timestamp_pb2.Timestamp
    decided_by: str
    decision: _struct_pb2.Value
    workflow: str
    def __init__(self, approval_id: _Optional[str] = ..., run_id: _Optional[str] = ..., node: _Optional[str] = ..., step_id: _Optional[str] = ..., title: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_by: _Optional[str] = ..., decision: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., workflow: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("run_id", "all", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    all: bool
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., all: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals",)
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "approved", "comment")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approved: bool
    comment: str
    def __init__(self, approval_id: _Optional[str] = ..., approved: _Optional[bool] = ..., comment: _Optional[str] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: Approval
    def __init__(self, approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class Webhook(_message.Message):
    __slots__ = ("name", "send_event", "submit_once", "created_by", "created_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEND_EVENT_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_ONCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    send_event: WebhookSendEvent
    submit_once: WebhookSubmitOnce
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., send_event: _Optional[_Union[WebhookSendEvent, _Mapping]] = ..., submit_once: _Optional[_Union[WebhookSubmitOnce, _Mapping]] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WebhookSendEvent(_message.Message):
    __slots__ = ("run_id_pointer", "event")
    RUN_ID_POINTER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    run_id_pointer: str
    event: str
    def __init__(self, run_id_pointer: _Optional[str] = ..., event: _Optional[str] = ...) -> None: ...

class WebhookSubmitOnce(_message.Message):
    __slots__ = ("workflow", "key_pointer")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    KEY_POINTER_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    key_pointer: str
    def __init__(self, workflow: _Optional[str] = ..., key_pointer: _Optional[str] = ...) -> None: ...

class CreateWebhookRequest(_message.Message):
    __slots__ = ("webhook", "secret")
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    webhook: Webhook
    secret: str
    def __init__(self, webhook: _Optional[_Union[Webhook, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class CreateWebhookResponse(_message.Message):
    __slots__ = ("webhook", "secret")
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    webhook: Webhook
    secret: str
    def __init__(self, webhook: _Optional[_Union[Webhook, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListWebhooksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWebhooksResponse(_message.Message):
    __slots__ = ("webhooks",)
    WEBHOOKS_FIELD_NUMBER: _ClassVar[int]
    webhooks: _containers.RepeatedCompositeFieldContainer[Webhook]
    def __init__(self, webhooks: _Optional[_Iterable[_Union[Webhook, _Mapping]]] = ...) -> None: ...

class DeleteWebhookRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteWebhookResponse(_message.Message):
    __slots__ = ("webhook",)
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    webhook: Webhook
    def __init__(self, webhook: _Optional[_Union[Webhook, _Mapping]] = ...) -> None: ...
