"""The typed data the wings share: the JSON shapes inside rows, the steps a claim
hands out, and the outcomes a worker reports (:class:`Outcome`) with what applying
one answers (:class:`Completion`, or for one item of a batch :class:`Refused`).

Every named query that returns rows has a row type, a NamedTuple whose fields are the
query's columns in order (service.db.pool checks them against each result, so a query
and its type cannot drift apart); those one table family uses live in its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, NotRequired, TypedDict

from service.errors import CycloneError


class RunErrorJson(TypedDict, total=False):
    """runs.error: why a run failed or is blocked."""

    kind: str
    message: str
    node: str
    attempt: int | None
    started_at: str | None
    # A run blocked on a step call of a durable function: the call, and its function.
    step_id: str
    function: str


class StepCallErrorJson(TypedDict):
    """step_calls.error: the error a step call raised (module, args and attributes
    when its worker recorded them)."""

    type: str
    message: str
    details: str
    module: NotRequired[str]
    args: NotRequired[list[Any]]
    attributes: NotRequired[dict[str, Any]]


class StepCallJson(TypedDict):
    """One journal entry (cyclone._step_call_json): a step call of a durable function."""

    step_id: str
    seq: int
    function: str
    status: str
    unsafe: bool
    output: Any
    error: StepCallErrorJson | None
    attempt: int
    started_at: str
    finished_at: str | None
    wake_at: str | None
    waiting_for: str | None


class StepErrorJson(TypedDict):
    """One entry of a step's error history."""

    node: str
    attempt: int
    kind: str
    type: str
    message: str
    details: str
    retryable: bool
    at: str


class LastErrorJson(TypedDict):
    """A step's latest error, as Explain reads it."""

    attempt: int
    kind: str
    type: str
    message: str
    at: str


class StepJson(TypedDict):
    """One step of run_get."""

    node: str
    action: str
    status: str
    attempt: int
    max_attempts: int
    depends_on: list[str]
    trigger_rule: str
    input: Any
    output: Any
    progress: Any
    worker_id: str | None
    lease_expires_at: str | None
    last_heartbeat_at: str | None
    available_at: str | None
    started_at: str | None
    finished_at: str | None
    effect_uncertain: bool
    timeout_s: float
    resumes: int
    recoveries: int
    waiting_for: str | None
    priority: int
    concurrency_key: str | None
    build_id: NotRequired[str | None]
    waiting: NotRequired[str | None]
    rate_reopens_at: NotRequired[str | None]
    unsafe: NotRequired[bool]
    journal: list[StepCallJson] | None
    # The node's policy as submitted (run_get reads them; other readers of steps not).
    concurrency_limit: NotRequired[int | None]
    attempt_budget: NotRequired[int]
    initial_backoff_s: NotRequired[float]
    max_backoff_s: NotRequired[float]
    backoff_multiplier: NotRequired[float]


class AuditJson(TypedDict):
    """One entry of a run's audit trail."""

    action: str
    node: str
    actor: str
    reason: str
    details: Any
    at: str


class UpstreamJson(TypedDict):
    """An upstream node of a step, as Explain reads it (with its latest error when it
    is a failed node behind a skipped step)."""

    node: str
    status: str
    attempt: int
    error: NotRequired[LastErrorJson | None]


class UpstreamFailureJson(TypedDict):
    """A failed upstream node handed out with a claim (for failure-handling nodes)."""

    node: str
    status: str
    error: StepErrorJson | None


class CancelJson(TypedDict):
    actor: str
    reason: str
    at: str


class PauseJson(TypedDict):
    """step_explain: the pause holding a step; kind run, workflow or action."""

    kind: str
    name: str
    actor: str
    reason: str
    at: str


class ClaimedStep(NamedTuple):
    """step_claim: a step handed out, or one that blocked its run instead; the ids as
    text (canonical: lower case, hyphenated), as workers get them."""

    run_id: str
    node: str
    action: str
    workflow: str
    attempt: int
    max_attempts: int
    input: Any
    # The run's input and the outputs of the upstream nodes (an object by node name)
    # as JSON text, not parsed: the steps of one claim often share them (all the
    # leaves of a fan-out have the same upstream), and service.api.wire writes each
    # distinct text once per claim.
    run_input: str | None
    upstream: str | None
    lease_token: str
    lease_expires_at: datetime
    deadline_at: datetime
    progress: Any
    effect_uncertain: bool
    blocked: bool
    waited_s: float
    upstream_failures: list[UpstreamFailureJson] | None
    journal: list[StepCallJson] | None
    # The run's deadline and the submitting client's traceparent; None when it has none.
    run_deadline: datetime | None
    traceparent: str | None


class Ready(NamedTuple):
    """steps_release, step_resolve: the actions made claimable."""

    ready: str | None


class Kept(NamedTuple):
    """step_logs_add"""

    kept: int


class StepCallBegun(NamedTuple):
    """step_call_begin: run, recorded or uncertain; the entry (None: a safe call to run)."""

    decision: str
    run_status: str
    call: StepCallJson | None


class StepCallEnded(NamedTuple):
    """step_call_end: the entry as recorded (None in a brief answer); duplicate when it
    had an outcome already."""

    duplicate: bool
    call: StepCallJson | None


class Deleted(NamedTuple):
    """runs_purge, submit_keys_purge"""

    deleted: int


class NoRows(NamedTuple):
    """action_claims_note, clock_advance: statements that return no rows."""


@dataclass(frozen=True, slots=True)
class Failure:
    """A handler's failure as a worker reports it (uncertain: an unsafe handler stopped
    without an outcome). Its fields, in this order, are step_complete_many's JSON."""

    type: str
    message: str
    details: str
    retryable: bool
    retry_after_s: float | None
    uncertain: bool


class Outcome(NamedTuple):
    """One step's outcome to apply: an output (JSON text) or a failure. The ids are
    canonical text (service.api.ids.uuid_text) and the node a checked name, so that
    they go into JSON as they are. (A NamedTuple, as Completion: one is made per step,
    and a frozen dataclass costs a call per field to make.)"""

    run_id: str
    node: str
    lease_token: str
    output_json: str | None = None
    failure: Failure | None = None
    # The handler's log lines sent with it: a JSON array of {at, level, logger,
    # message}, or None when there are none (then no statement stores any).
    logs_json: str | None = None


class Completion(NamedTuple):
    """An outcome applied: where it left the step and its run."""

    step_status: str
    run_status: str
    duplicate: bool
    retry_at: datetime | None


@dataclass(frozen=True, slots=True)
class Refused:
    """An outcome of a batch that the engine refused, as the domain error it means."""

    error: CycloneError


class Placement(NamedTuple):
    """shard_placements: the node that holds a shard of the runs, whether it is the
    node the server is connected to, and the range of the run ids' hashes it holds."""

    shard: int
    host: str
    port: int
    local: bool
    low: int
    high: int


class Sharded(NamedTuple):
    """sharded: whether the run-level tables are distributed (Citus)."""

    sharded: bool
