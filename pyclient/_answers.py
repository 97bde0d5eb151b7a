"""What the schedule, explain, count and worker calls answer (re-exported by
:mod:`pyclient.models`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from cyclone.v1 import admin_service_pb2, schedule_service_pb2, types_pb2, workflow_service_pb2
from pyclient._runs import (
    Run,
    RunError,
    RunPause,
    RunStatus,
    Step,
    StepError,
    StepStatus,
    _build,
    _enum_of,
    _jsonable,
)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule kept by the server: the workflow it submits (by name; its nodes are
    in the server's copy), when (``cron`` in ``time_zone``, or every ``interval``), and
    its policies: ``overlap`` is ``"skip"`` or ``"allow"``, ``catch_up`` ``"skip"`` or
    ``"all"`` (docs/schedules.md)."""

    name: str
    workflow: str
    input: Any
    cron: str | None
    time_zone: str | None
    interval: dt.timedelta | None
    overlap: str
    catch_up: str
    paused: bool
    next_fire_at: dt.datetime | None
    last_fire_at: dt.datetime | None
    last_run_id: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    #: The tags each run it submits carries.
    tags: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: times in ISO 8601, the interval in seconds."""
        ready: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return ready

    @classmethod
    def from_proto(cls, p: schedule_service_pb2.Schedule) -> Schedule:
        cron = p.WhichOneof("spec") == "cron"
        return _build(
            cls,
            p,
            workflow=p.workflow.name,
            cron=p.cron if cron else None,
            time_zone=(p.time_zone or "UTC") if cron else None,
            interval=None if cron else p.interval.ToTimedelta(),
            overlap=_policy(schedule_service_pb2.OverlapPolicy, p.overlap, "OVERLAP_POLICY_"),
            catch_up=_policy(schedule_service_pb2.CatchUpPolicy, p.catch_up, "CATCH_UP_POLICY_"),
        )


def _policy(enum_type: Any, number: int, prefix: str) -> str:
    name: str = enum_type.Name(number) if number in enum_type.values() else str(number)
    return "skip" if number == 0 else name.removeprefix(prefix).lower()


@dataclass(frozen=True, slots=True)
class SchedulePage:
    """One page of list_schedules; pass ``next_page_token`` back for the next one."""

    schedules: tuple[Schedule, ...]
    next_page_token: str


class ExplainReason(enum.StrEnum):
    """Why a node is not running now (see Client.explain)."""

    WAITING_ON_UPSTREAM = "waiting_on_upstream"
    BACKING_OFF = "backing_off"
    READY = "ready"
    QUEUED = "queued"
    NO_WORKER = "no_worker"
    RUNNING = "running"
    LEASE_EXPIRED = "lease_expired"
    BLOCKED = "blocked"
    DISCARDED = "discarded"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    CONCURRENCY_LIMITED = "concurrency_limited"
    RATE_LIMITED = "rate_limited"
    WAITING = "waiting"
    NOT_BEFORE = "not_before"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class NodeState:
    """An upstream node behind an explanation, with its last failure when discarded."""

    node: str
    status: StepStatus
    attempt: int
    last_error: StepError | None

    @classmethod
    def from_proto(cls, p: workflow_service_pb2.NodeState) -> NodeState:
        return _build(
            cls,
            p,
            status=_enum_of(StepStatus, "STEP_STATUS_", p.status, types_pb2.StepStatus),
            last_error=StepError.from_proto(p.last_error) if p.HasField("last_error") else None,
        )


@dataclass(frozen=True, slots=True)
class ActionActivity:
    """What the servers saw of the workers serving an action (a few seconds behind)."""

    action: str
    last_polled_at: dt.datetime | None
    last_polled_by: str
    last_claimed_at: dt.datetime | None
    last_claimed_by: str
    ready_ahead: int
    running: int
    #: The server serves it itself (cyclone.event): no worker asks for it.
    served_by_server: bool = False

    @classmethod
    def from_proto(cls, p: workflow_service_pb2.ActionActivity) -> ActionActivity:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a node is not running now: a reason, a sentence, and the facts behind them."""

    reason: ExplainReason
    message: str
    step: Step | None
    run_status: RunStatus
    run_error: RunError | None
    upstream: tuple[NodeState, ...]
    action: ActionActivity | None

    def to_dict(self) -> dict[str, Any]:
        ready: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return ready

    @classmethod
    def from_proto(cls, p: workflow_service_pb2.ExplainResponse) -> Explanation:
        return _build(
            cls,
            p,
            reason=_enum_of(
                ExplainReason, "EXPLAIN_REASON_", p.reason, workflow_service_pb2.ExplainReason
            ),
            step=Step.from_proto(p.step) if p.HasField("step") else None,
            run_status=RunStatus.from_proto(p.run_status),
            run_error=RunError.from_proto(p.run_error) if p.HasField("run_error") else None,
            upstream=tuple(NodeState.from_proto(u) for u in p.upstream),
            action=ActionActivity.from_proto(p.action) if p.HasField("action") else None,
        )


@dataclass(frozen=True, slots=True)
class EventSent:
    """What ``send_event`` did: the event's id, and False for ``created`` when its key
    named an event sent before (nothing was sent again)."""

    event_id: int
    created: bool


@dataclass(frozen=True, slots=True)
class RunCount:
    """The runs in one status (count_runs): exact, or at least ``count`` when
    ``at_least``."""

    status: RunStatus | str
    count: int
    at_least: bool

    @classmethod
    def from_proto(cls, p: workflow_service_pb2.RunCount) -> RunCount:
        return cls(RunStatus.from_proto(p.status), int(p.count), p.at_least)

    def __str__(self) -> str:
        return f"{self.count:,}+" if self.at_least else f"{self.count:,}"


@dataclass(frozen=True, slots=True)
class RunStep:
    """A step across runs (list_steps), with its run's id and workflow."""

    run_id: str
    workflow: str
    step: Step


@dataclass(frozen=True, slots=True)
class StepPage:
    """One page of list_steps; pass ``next_page_token`` back for the next one."""

    steps: tuple[RunStep, ...]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """A worker as the steps it holds and its last requests for work show it
    (list_workers; idle when it holds none); ``unhealthy``: a lease of it lapsed with no
    outcome, and it is handed nothing until it reports again."""

    worker_id: str
    actions: tuple[str, ...]
    running: int
    last_heartbeat_at: dt.datetime | None
    lease_expired: int
    unhealthy: bool = False
    unhealthy_since: dt.datetime | None = None
    #: Its build, when it last asked for work, and the actions it asked for then.
    build_id: str = ""
    last_seen_at: dt.datetime | None = None
    serves: tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, p: workflow_service_pb2.WorkerSummary) -> WorkerSummary:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class Workers:
    """What list_workers returns: the workers holding steps, and every action's
    activity (``ready_ahead`` is its ready steps, counted up to 10,000)."""

    workers: tuple[WorkerSummary, ...]
    actions: tuple[ActionActivity, ...]


@dataclass(frozen=True, slots=True)
class BuildWorker:
    """A worker seen declaring a build, and when it last did."""

    worker_id: str
    seen_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class Build:
    """A build workers declared (list_builds): its compatibility set (``compatible``,
    itself included), the workers seen with it, its unfinished nodes with a journal
    (and their runs), and whether it is retired."""

    build_id: str
    compatible: tuple[str, ...]
    workers: tuple[BuildWorker, ...]
    pinned_nodes: int
    pinned_runs: int
    retired: bool
    retired_at: dt.datetime | None
    created_at: dt.datetime | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: times in ISO 8601."""
        ready: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return ready

    @classmethod
    def from_proto(cls, p: admin_service_pb2.Build) -> Build:
        workers = tuple(_build(BuildWorker, w) for w in p.workers)
        return _build(cls, p, workers=workers)


@dataclass(frozen=True, slots=True)
class BuildRun:
    """A run with unfinished nodes pinned to a build (list_build_runs)."""

    run_id: str
    workflow: str
    nodes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "nodes": list(self.nodes)}


@dataclass(frozen=True, slots=True)
class WorkflowDeadline:
    """A workflow's default deadline (set_workflow_deadline): a run of it submitted
    without a deadline is cancelled this long after its submit; who set it, when, why."""

    workflow: str
    deadline: dt.timedelta
    set_by: str
    set_at: dt.datetime | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the deadline in seconds, times in ISO 8601."""
        ready: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        ready["deadline"] = self.deadline.total_seconds()
        return ready

    @classmethod
    def from_proto(cls, p: admin_service_pb2.WorkflowDeadline) -> WorkflowDeadline:
        return _build(cls, p, deadline=p.deadline.ToTimedelta())


@dataclass(frozen=True, slots=True)
class BuildMoved:
    """What move_build moved: unfinished nodes, and the runs they belong to."""

    nodes_moved: int
    runs_moved: int

    def to_dict(self) -> dict[str, Any]:
        return {"nodes_moved": self.nodes_moved, "runs_moved": self.runs_moved}


@dataclass(frozen=True, slots=True)
class Paused:
    """What pause_run / resume_run answer: the run after the call, and whether it
    changed anything (False: it was paused already, or not paused)."""

    run: Run
    changed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "run": self.run.to_dict()}


@dataclass(frozen=True, slots=True)
class NamePause:
    """A paused workflow or action (``kind``), as list_pauses shows it, or what
    pause_workflow, pause_action and their resumes answer (``changed``: False when it
    was paused already, or not paused; ``pause`` None after a resume)."""

    kind: str
    name: str
    changed: bool
    pause: RunPause | None

    def to_dict(self) -> dict[str, Any]:
        pause = self.pause
        return {
            "kind": self.kind,
            "name": self.name,
            "changed": self.changed,
            "pause": None
            if pause is None
            else {
                "actor": pause.actor,
                "reason": pause.reason,
                "at": pause.at.isoformat() if pause.at else None,
            },
        }


@dataclass(frozen=True, slots=True)
class BulkAction:
    """A bulk action's job (start_bulk, get_bulk): what it does to each run
    (``"cancel"``, ``"retry"`` or ``"resolve_discard"``), the ListRuns filter of its
    runs (as JSON), and its progress: ``state`` is ``"running"``, ``"done"`` or
    ``"cancelled"``; ``total`` is the runs it was to take when it started (at least that
    many when ``total_at_least``)."""

    job_id: str
    action: str
    filter: dict[str, Any]
    reason: str
    actor: str
    state: str
    total: int
    total_at_least: bool
    touched: int
    skipped: int
    failed: int
    last_error: str
    cancelled_by: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    finished_at: dt.datetime | None

    @property
    def running(self) -> bool:
        return self.state == "running"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: times in ISO 8601."""
        ready: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return ready

    @classmethod
    def from_proto(cls, p: admin_service_pb2.BulkAction) -> BulkAction:
        return _build(
            cls,
            p,
            action=_policy(admin_service_pb2.BulkActionKind, p.action, "BULK_ACTION_KIND_"),
            state=_policy(admin_service_pb2.BulkActionState, p.state, "BULK_ACTION_STATE_"),
            filter=json_format.MessageToDict(p.filter),
        )


@dataclass(frozen=True, slots=True)
class BulkStarted:
    """What start_bulk answers: the job (None for a dry run) and the runs it takes (or
    would take), exactly up to 100,000 (``at_least``: more)."""

    job: BulkAction | None
    matched: int
    at_least: bool

    @classmethod
    def from_proto(cls, p: admin_service_pb2.StartBulkActionResponse) -> BulkStarted:
        job = BulkAction.from_proto(p.job) if p.HasField("job") else None
        return cls(job, int(p.matched), p.matched_at_least)


@dataclass(frozen=True, slots=True)
class BulkPage:
    """A page of bulk actions (list_bulk), newest first."""

    jobs: tuple[BulkAction, ...]
    next_page_token: str
