"""The typed data that travels between the servicers and the store.

Every named query of ``service/sql/queries.sql`` that returns rows has a row type
here, a NamedTuple whose fields are the query's columns in order (service.store
checks them against each result, so a query and its type cannot drift apart). JSON
columns keep their JSON shape, described by the TypedDicts below. The outcomes a
worker reports travel to the store as :class:`Outcome`; what the store answers is
a :class:`Completion`, or for one item of a batch a :class:`Refused`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, NotRequired, TypedDict

from service.errors import CycloneError

# JSON inside rows ------------------------------------------------------------------
# Times inside JSON columns are ISO 8601 strings.


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
    """step_calls.error: the error a step call raised."""

    type: str
    message: str
    details: str


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
    waiting_for: str | None
    priority: int
    concurrency_key: str | None
    journal: list[StepCallJson] | None


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


# Rows of the named queries -----------------------------------------------------------


class Submitted(NamedTuple):
    """run_submit"""

    run_id: uuid.UUID
    created: bool
    ready: str | None


class RunRow(NamedTuple):
    """run_get: a run with its steps, errors and audit trail."""

    run_id: uuid.UUID
    workflow: str
    status: str
    input: Any
    error: RunErrorJson | None
    submit_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    parent_run_id: uuid.UUID | None
    parent_node: str | None
    parent_step_id: str | None
    steps: list[StepJson]
    errors: list[StepErrorJson]
    audit: list[AuditJson]
    priority: int
    start_at: datetime | None


class RunSummary(NamedTuple):
    """runs_list: a run with the count of its steps by status."""

    run_id: uuid.UUID
    workflow: str
    status: str
    input: Any
    error: RunErrorJson | None
    submit_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    parent_run_id: uuid.UUID | None
    parent_node: str | None
    parent_step_id: str | None
    step_counts: dict[str, int] | None


class RunCountRow(NamedTuple):
    """runs_count: the runs in one status, counted up to the limit asked."""

    status: str
    n: int


class StepListed(NamedTuple):
    """steps_list: a step across runs, with its run's workflow and its errors."""

    at: datetime
    run_id: uuid.UUID
    workflow: str
    step: StepJson
    errors: list[StepErrorJson]


class WorkerAction(NamedTuple):
    """workers_running: one worker's running steps of one action."""

    worker_id: str
    action: str
    running: int
    last_heartbeat_at: datetime | None
    lease_expired: int


class ActionSeenRow(NamedTuple):
    """actions_activity: what the servers saw of one action's workers (nothing when no
    Claim named it), and its ready steps (up to 10,000)."""

    action: str
    polled_at: datetime | None
    polled_by: str | None
    claimed_at: datetime | None
    claimed_by: str | None
    ready_count: int


class ChildStarted(NamedTuple):
    """child_start: the child run of a step call, and whether this call submitted it."""

    child_run_id: uuid.UUID
    created: bool
    call: StepCallJson
    ready: str | None


class Cancelled(NamedTuple):
    """run_cancel"""

    run_cancel: Any
    #: The actions of the steps it made claimable (parents woken), comma-separated.
    ready: str | None


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
    # leaves of a fan-out have the same upstream), and service.wire writes each
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


class Candidate(NamedTuple):
    """step_candidates_sharded: a ready step found on some shard (Citus claims), with
    its run's shard and whether flow control applies to it."""

    run_id: uuid.UUID
    node: str
    action: str
    shard: int
    concurrency_key: str | None
    concurrency_limit: int | None
    flow: bool


class Sharded(NamedTuple):
    """sharded: whether the run-level tables are distributed (Citus)."""

    sharded: bool


class Ready(NamedTuple):
    """steps_release, step_resolve: the actions made claimable."""

    ready: str | None


class NextDue(NamedTuple):
    """step_next_due"""

    seconds: float | None


class Attempt(NamedTuple):
    """step_attempt"""

    attempt: int


class Heartbeat(NamedTuple):
    """step_heartbeat"""

    lease_expires_at: datetime
    cancelled: bool


class Kept(NamedTuple):
    """step_logs_add"""

    kept: int


class LogRow(NamedTuple):
    """step_logs_get: one log line of a step's attempt."""

    node: str
    attempt: int
    seq: int
    at: datetime
    level: str
    logger: str
    message: str


class RunErrorRow(NamedTuple):
    """runs_errors"""

    run_id: uuid.UUID
    error: Any


class OutcomeRow(NamedTuple):
    """step_complete, step_fail, step_abandon"""

    step_status: str
    run_status: str
    duplicate: bool
    retry_at: datetime | None
    ready: str | None


class BatchRow(NamedTuple):
    """step_complete_many: one row per item; error_state set when it was refused."""

    i: int
    step_status: str | None
    run_status: str | None
    duplicate: bool | None
    retry_at: datetime | None
    error_state: str | None
    error_message: str | None
    error_detail: str | None
    ready: str | None


class ReportRow(NamedTuple):
    """step_report_many: one row per item, a step call's end (kind "end") or begin
    ("begin"), or a completion ("step"); error_state set when it was refused."""

    kind: str
    i: int
    step_status: str | None
    run_status: str | None
    duplicate: bool | None
    retry_at: datetime | None
    decision: str | None
    call: StepCallJson | None
    error_state: str | None
    error_message: str | None
    error_detail: str | None
    ready: str | None


class StepCallBegun(NamedTuple):
    """step_call_begin: run, recorded or uncertain; the entry (None: a safe call to run)."""

    decision: str
    run_status: str
    call: StepCallJson | None


class Waited(NamedTuple):
    """step_wait: ready (the entry has its outcome) or suspended (it is waiting, the
    node gave up its lease), and the actions made claimable (a suspension notifies)."""

    decision: str
    call: StepCallJson
    ready: str | None


class EventSent(NamedTuple):
    """event_send: the event's id, whether this call sent it, the actions woken."""

    event_id: int
    created: bool
    ready: str | None


class StepCallEnded(NamedTuple):
    """step_call_end: the entry as recorded (None in a brief answer); duplicate when it
    had an outcome already."""

    duplicate: bool
    call: StepCallJson | None


class CallResolved(NamedTuple):
    """step_call_resolve: the node whose step call was resolved."""

    node: str
    ready: str | None


class Retried(NamedTuple):
    """step_retry"""

    nodes: list[str]
    ready: str | None


class Pending(NamedTuple):
    """releases_pending: a run with a release in progress."""

    run_id: uuid.UUID


class Continued(NamedTuple):
    """release_continue: whether dependents are left to count, and the actions made
    claimable."""

    more: bool
    ready: str | None


class Swept(NamedTuple):
    """sweep: a step whose lease expired, and the status it was left in."""

    run_id: uuid.UUID
    node: str
    action: str
    attempt: int
    worker_id: str | None
    status: str
    ready: str | None


class Deleted(NamedTuple):
    """runs_purge, submit_keys_purge"""

    deleted: int


class ExplainFacts(NamedTuple):
    """step_explain: everything Explain needs about one step (step columns are None
    when the run has no such node)."""

    run_status: str
    run_error: RunErrorJson | None
    now: datetime
    node: str | None
    action: str
    status: str
    attempt: int
    max_attempts: int
    trigger_rule: str
    deps_open: int
    available_at: datetime | None
    lease_expires_at: datetime | None
    deadline_at: datetime | None
    worker_id: str | None
    started_at: datetime | None
    last_heartbeat_at: datetime | None
    finished_at: datetime | None
    unsafe: bool | None
    effect_uncertain: bool
    last_error: LastErrorJson | None
    upstream: list[UpstreamJson]
    failed_upstream: list[UpstreamJson] | None
    polled_at: datetime | None
    polled_by: str | None
    claimed_at: datetime | None
    claimed_by: str | None
    ready_ahead: int | None
    action_running: int | None
    cancel: CancelJson | None
    run_id: uuid.UUID
    waiting_for: str | None
    resumes: int | None
    concurrency_key: str | None
    concurrency_limit: int | None
    key_running: int | None
    rate_reopens_at: datetime | None


class ExplainCounts(NamedTuple):
    """step_explain_counts: Explain's counts of other steps (read across shards)."""

    ready_ahead: int | None
    action_running: int | None
    key_running: int | None


class GaugeRow(NamedTuple):
    """metrics_gauges: one gauge reading (part: runs, available or running)."""

    part: str
    label: str
    n: int
    age_s: float | None
    extra: int


class ScheduleTurn(NamedTuple):
    """schedules_turn: whether this server's firing pass may go on (Citus)."""

    turn: bool


class ScheduleRow(NamedTuple):
    """schedule_create, schedule_get, schedules_list, schedule_pause, schedule_resume:
    one schedule (workflow: the Workflow message as JSON)."""

    name: str
    workflow: dict[str, Any]
    input: Any
    cron: str | None
    time_zone: str | None
    interval_s: int | None
    overlap: str
    catch_up: str
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    last_run_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime


class DueSchedule(NamedTuple):
    """schedules_due: a schedule due to fire, locked by the firing transaction, with
    the database's time. One whose nodes still hold key templates (not nodes_keyed)
    comes with its workflow (the Workflow message as JSON) and input; otherwise both
    are None."""

    now: datetime
    name: str
    cron: str | None
    time_zone: str | None
    interval_s: int | None
    catch_up: str
    next_fire_at: datetime
    nodes_keyed: bool = True
    workflow: dict[str, Any] | None = None
    input: Any = None


class Fired(NamedTuple):
    """schedule_fire: one firing of a schedule (run_id None: skipped for overlap)."""

    fire_at: datetime
    submit_key: str
    run_id: uuid.UUID | None
    outcome: str


class Now(NamedTuple):
    """clock_now: the engine's time (cyclone.now())."""

    now: datetime


class ScheduleName(NamedTuple):
    """schedule_delete: the schedule deleted."""

    name: str


class ReadyActions(NamedTuple):
    """ready_actions: the actions a transaction made claimable so far."""

    ready: str | None


class NoRows(NamedTuple):
    """action_claims_note, clock_advance: statements that return no rows."""


# Outcomes ---------------------------------------------------------------------------


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
    canonical text (service.store.uuid_text) and the node a checked name, so that
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
