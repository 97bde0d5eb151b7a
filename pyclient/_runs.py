"""Runs and steps as the client returns them (re-exported by :mod:`pyclient.models`),
and how they are read from the protobuf messages."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import struct_pb2, timestamp_pb2

from cyclone.jsonvalue import from_value
from cyclone.v1 import types_pb2
from pyclient.workflow import RetryPolicy

T = TypeVar("T")


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Nothing will change without an operator: completed, failed or cancelled."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)

    def to_proto(self) -> types_pb2.RunStatus:
        number: types_pb2.RunStatus = getattr(types_pb2, f"RUN_STATUS_{self.name}")
        return number

    @classmethod
    def from_proto(cls, number: int) -> RunStatus | str:
        found: RunStatus | str = _enum_of(cls, "RUN_STATUS_", number, types_pb2.RunStatus)
        return found


class StepStatus(enum.StrEnum):
    PENDING = "pending"
    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    DISCARDED = "discarded"
    UNCERTAIN = "uncertain"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


def _enum_of(cls: type[enum.StrEnum], prefix: str, number: int, proto_enum: Any) -> Any:
    name = proto_enum.Name(number).removeprefix(prefix).lower()
    return cls(name) if name in cls._value2member_map_ else name


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def timestamp_datetime(ts: timestamp_pb2.Timestamp) -> dt.datetime:
    """``ts`` as an aware UTC datetime: what ``ts.ToDatetime(tzinfo=dt.UTC)`` gives
    (truncated to the microsecond), for half its cost (a worker reads two per step)."""
    return _EPOCH + dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def time_field(owner: Any, name: str) -> dt.datetime | None:
    """A Timestamp field as an aware UTC datetime; None when unset."""
    if not owner.HasField(name):
        return None
    return timestamp_datetime(getattr(owner, name))


def value_field(owner: Any, name: str) -> Any:
    """A Value field as a Python value; None when unset."""
    return from_value(getattr(owner, name)) if owner.HasField(name) else None


#: The function a child run's start is journaled under (StartChild).
CHILD_START_FUNCTION = "cyclone.start_child"


def _build(cls: type[T], msg: Any, **given: Any) -> T:
    """``cls`` from the same-named fields of ``msg``; ``given`` for the others.

    Timestamps become datetimes, Values Python values, repeated fields tuples and
    maps dicts; scalars are taken as they are.
    """
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in given:
            values[f.name] = given[f.name]
            continue
        raw = getattr(msg, f.name)
        if isinstance(raw, timestamp_pb2.Timestamp):
            values[f.name] = time_field(msg, f.name)
        elif isinstance(raw, struct_pb2.Value):
            values[f.name] = value_field(msg, f.name)
        elif isinstance(raw, Mapping):
            values[f.name] = dict(raw)
        elif isinstance(raw, Sequence) and not isinstance(raw, str):
            values[f.name] = tuple(raw)
        else:
            values[f.name] = raw
    return cls(**values)


@dataclass(frozen=True, slots=True)
class StepError:
    """One failure of a node."""

    attempt: int
    kind: str
    type: str
    message: str
    details: str
    retryable: bool
    at: dt.datetime | None

    @property
    def worker_lost(self) -> bool:
        """The attempt lost its worker (it died or froze: its lease lapsed before the
        step's deadline): not a failure, and not counted against the retry policy."""
        return self.kind == "lease_expired" and self.type == "WorkerLost"

    @classmethod
    def from_proto(cls, p: types_pb2.StepError) -> StepError:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """A direct upstream node that did not succeed, as a cleanup node (trigger rule
    ``all_done`` or ``one_failed``) receives it with its claim: ``ctx.upstream_failures``."""

    node: str
    #: ``discarded`` (it failed for good) or ``skipped`` (one of its own upstream
    #: nodes failed, so it never ran).
    status: StepStatus
    #: Its last error (attempt, kind, type, message, details); None when skipped.
    error: StepError | None

    @classmethod
    def from_proto(cls, p: Any) -> UpstreamFailure:
        return cls(
            node=p.node,
            status=_enum_of(StepStatus, "STEP_STATUS_", p.status, types_pb2.StepStatus),
            error=StepError.from_proto(p.error) if p.HasField("error") else None,
        )


class StepCallStatus(enum.StrEnum):
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: A wait (sleep, event, child run) that is not over: its node gave up its lease.
    WAITING = "waiting"
    #: A wait that never ended: its run was cancelled (GetRun's view of such a wait).
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class StepCallError:
    """The error a step call raised: its exception's type name, message and details;
    the module of its type, its args (a list) and its JSON attributes (a dict) when
    its worker recorded them (empty and None otherwise)."""

    type: str
    message: str
    details: str
    module: str = ""
    args: Any = None
    attributes: Any = None

    @classmethod
    def from_proto(cls, p: types_pb2.StepCallError) -> StepCallError:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class StepCall:
    """One entry of a node's journal: a step call its durable function recorded."""

    step_id: str
    #: Position of the call in the body, 1 for the first.
    seq: int
    function: str
    #: ``started`` (an unsafe call with no outcome yet), ``succeeded``, ``failed``, or
    #: ``waiting`` (a wait that is not over).
    status: StepCallStatus
    unsafe_to_repeat: bool
    #: The return value, when succeeded (None also when it returned nothing).
    output: Any
    #: The raised error, when failed.
    error: StepCallError | None
    #: The node attempt that last wrote the entry.
    attempt: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    #: For a wait: when its node looks again unwoken (None: no limit).
    wake_at: dt.datetime | None = None
    #: For a wait: what for ("sleep", "event order.approved", "child <run_id>").
    waiting_for: str = ""
    #: The digest of the call's arguments its worker recorded ("" when none was).
    args_digest: str = ""

    @classmethod
    def from_proto(cls, p: types_pb2.StepCall) -> StepCall:
        return _build(
            cls,
            p,
            status=_enum_of(
                StepCallStatus, "STEP_CALL_STATUS_", p.status, types_pb2.StepCallStatus
            ),
            error=StepCallError.from_proto(p.error) if p.HasField("error") else None,
        )


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line a handler logged in an attempt (``get_run(..., logs=True)``)."""

    at: dt.datetime | None
    level: str
    message: str
    attempt: int
    logger: str

    @classmethod
    def from_proto(cls, p: types_pb2.LogLine) -> LogLine:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class Step:
    """The stored state of one ``(run_id, node)``."""

    node: str
    action: str
    status: StepStatus
    attempt: int
    max_attempts: int
    depends_on: tuple[str, ...]
    trigger_rule: str
    input: Any
    output: Any
    errors: tuple[StepError, ...]
    worker_id: str
    lease_expires_at: dt.datetime | None
    available_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    effect_uncertain: bool
    timeout_s: float | None
    progress: Any
    #: When the holder of the lease last showed signs of life (claim or heartbeat).
    last_heartbeat_at: dt.datetime | None = None
    #: The node's journal, when its handler is a durable function: its step calls in
    #: call order (get_run only).
    journal: tuple[StepCall, ...] = ()
    #: Claims that resumed the node after it waited: counted in ``attempt``, not
    #: against ``max_attempts``.
    resumes: int = 0
    #: Attempts that lost their worker (its lease lapsed with no outcome): counted in
    #: ``attempt``, not against ``max_attempts``, but against the server's recovery
    #: budget ``max_recoveries`` (get_run only).
    recoveries: int = 0
    max_recoveries: int = 0
    #: While the node waits (available until ``available_at`` or woken): what for.
    waiting_for: str = ""
    #: Its claim priority (the node's, else the run's) and evaluated concurrency key
    #: ("" without one); docs/flow-control.md.
    priority: int = 0
    concurrency_key: str = ""
    #: The build of the worker whose claim started its current body ("" for none);
    #: while it has a journal, only that build's workers (or a compatible one's) take it.
    build_id: str = ""
    #: What its handlers logged, every attempt, oldest first (``get_run(..., logs=True)``).
    logs: tuple[LogLine, ...] = ()
    #: The node's retry policy as submitted (``max_attempts`` before any operator retry)
    #: and its concurrency limit (0 for none) (get_run only).
    retry: RetryPolicy | None = None
    concurrency_limit: int = 0
    #: While it waits with no worker holding it, for what: "sleep", "event", "child",
    #: "start" (its run's start time), "backoff" (a retry's), "rate_limit"; in Explain's
    #: step also "concurrency". "" otherwise. With the reason in plain words and until
    #: when (None: no time limit).
    waiting: str = ""
    waiting_reason: str = ""
    waiting_until: dt.datetime | None = None
    #: Whether its action was declared unsafe to repeat (by the worker that last held it).
    unsafe: bool = False

    @property
    def last_error(self) -> StepError | None:
        return self.errors[-1] if self.errors else None

    @classmethod
    def from_proto(cls, p: types_pb2.Step) -> Step:
        return _build(
            cls,
            p,
            status=_enum_of(StepStatus, "STEP_STATUS_", p.status, types_pb2.StepStatus),
            trigger_rule=trigger_rule_name(p.trigger_rule),
            errors=tuple(StepError.from_proto(e) for e in p.errors),
            journal=tuple(StepCall.from_proto(c) for c in p.journal),
            logs=tuple(LogLine.from_proto(line) for line in p.logs),
            timeout_s=p.timeout.ToTimedelta().total_seconds() if p.HasField("timeout") else None,
            retry=_retry_of(p.retry) if p.HasField("retry") else None,
        )


def _retry_of(p: types_pb2.RetryPolicy) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=p.max_attempts,
        initial_backoff=p.initial_backoff.ToTimedelta().total_seconds(),
        max_backoff=p.max_backoff.ToTimedelta().total_seconds(),
        multiplier=p.backoff_multiplier,
    )


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run is failed (``StepDiscarded``) or blocked (``EffectUncertain``)."""

    kind: str
    message: str
    node: str
    attempt: int
    started_at: dt.datetime | None
    #: For a run blocked on a step call of a durable function: its step_id, which
    #: ``resolve(..., step_id=...)`` names.
    step_id: str = ""

    @classmethod
    def from_proto(cls, p: types_pb2.RunError) -> RunError:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action on a run."""

    action: str
    node: str
    actor: str
    reason: str
    at: dt.datetime | None
    details: Any

    @classmethod
    def from_proto(cls, p: types_pb2.AuditEntry) -> AuditEntry:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class RunPause:
    """A pause of a run (``Run.pause``), a workflow or an action: who, why, when."""

    actor: str
    reason: str
    at: dt.datetime | None

    @classmethod
    def from_proto(cls, p: types_pb2.RunPause) -> RunPause:
        return _build(cls, p)


@dataclass(frozen=True, slots=True)
class Run:
    """One execution of a workflow. ``steps`` and ``audit`` are filled by get_run only."""

    run_id: str
    workflow: str
    status: RunStatus
    input: Any
    error: RunError | None
    submit_key: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    finished_at: dt.datetime | None
    steps: tuple[Step, ...] = ()
    audit: tuple[AuditEntry, ...] = ()
    step_counts: Mapping[str, int] = field(default_factory=dict)
    #: For a child run (``start_child`` in a durable function): the run, node and step
    #: call that started it; empty for a run a client submitted.
    parent_run_id: str = ""
    parent_node: str = ""
    parent_step_id: str = ""

    @property
    def children(self) -> tuple[tuple[str, str, str], ...]:
        """The child runs its durable functions started, as (node, step_id, run_id), in
        journal order (get_run only: read from the steps' journals)."""
        return tuple(
            (step.node, call.step_id, call.output["run_id"])
            for step in self.steps
            for call in step.journal
            if call.function == CHILD_START_FUNCTION
            and call.status == StepCallStatus.SUCCEEDED
            and isinstance(call.output, dict)
            and isinstance(call.output.get("run_id"), str)
        )

    #: The run's priority (get_run only) and the start time given to submit.
    priority: int = 0
    start_at: dt.datetime | None = None
    #: Set while the run is paused (pause_run): no step of it is claimed until resume_run.
    pause: RunPause | None = None
    #: The run's tags (key = value), given to submit; changed only by set_run_tags.
    tags: Mapping[str, str] = field(default_factory=dict)
    #: The run's deadline (given to submit, or its workflow's default): at it the run is
    #: cancelled. None: none.
    deadline: dt.datetime | None = None

    def step(self, node: str) -> Step:
        """The step of ``node``; KeyError when the run has none (or steps were not loaded)."""
        for step in self.steps:
            if step.node == node:
                return step
        raise KeyError(node)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: enums as strings, times in ISO 8601."""
        ready: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return ready

    @classmethod
    def from_proto(cls, p: types_pb2.Run) -> Run:
        return _build(
            cls,
            p,
            status=RunStatus.from_proto(p.status),
            error=RunError.from_proto(p.error) if p.HasField("error") else None,
            steps=tuple(Step.from_proto(s) for s in p.steps),
            audit=tuple(AuditEntry.from_proto(a) for a in p.audit),
            pause=RunPause.from_proto(p.pause) if p.HasField("pause") else None,
        )


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of list_runs; pass ``next_page_token`` back for the next (older) one,
    ``prev_page_token`` for the previous (newer) one; each is empty at its end."""

    runs: tuple[Run, ...]
    next_page_token: str
    prev_page_token: str = ""


@dataclass(frozen=True, slots=True)
class Retried:
    """What retry_all returns: the nodes reopened and the run after the retry."""

    nodes: tuple[str, ...]
    run: Run


@dataclass(frozen=True, slots=True)
class Submitted:
    """What submit_once returns: the run for the key, and whether this call created it."""

    run_id: str
    created: bool


def trigger_rule_name(number: int) -> str:
    if number == types_pb2.TRIGGER_RULE_UNSPECIFIED:
        return "all_success"
    return types_pb2.TriggerRule.Name(number).removeprefix("TRIGGER_RULE_").lower()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dt.datetime):
        return obj.isoformat()
    if isinstance(obj, dt.timedelta):
        return obj.total_seconds()
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj
