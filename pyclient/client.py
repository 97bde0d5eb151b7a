"""Client and AsyncClient: submit workflows, inspect and steer runs.

Both speak to the WorkflowService and the AdminService. Each method is described
once (request, RPC, how to read the answer) by the functions of ``_calls``; the two
classes only differ in how they wait. gRPC errors are raised as pyclient.errors
exceptions that keep the server's message.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf import message as pb_message

from cyclone import dag, flow
from cyclone.jsonvalue import to_value
from cyclone.v1 import (
    admin_service_pb2 as admin_pb,
)
from cyclone.v1 import (
    admin_service_pb2_grpc as admin_grpc,
)
from cyclone.v1 import (
    schedule_service_pb2 as schedule_pb,
)
from cyclone.v1 import (
    schedule_service_pb2_grpc as schedule_grpc,
)
from cyclone.v1 import (
    workflow_service_pb2 as wf_pb,
)
from cyclone.v1 import (
    workflow_service_pb2_grpc as wf_grpc,
)
from pyclient.errors import InvalidArgument, WaitTimeout, from_rpc_error
from pyclient.models import (
    ActionActivity,
    EventSent,
    Explanation,
    Retried,
    Run,
    RunCount,
    RunPage,
    RunStatus,
    RunStep,
    Schedule,
    SchedulePage,
    Step,
    StepPage,
    StepStatus,
    Submitted,
    Workers,
    WorkerSummary,
)
from pyclient.workflow import RetryPolicy, Workflow

DEFAULT_ADDRESS = "127.0.0.1:50051"
#: Per-call deadline, in seconds, unless the client is given another.
DEFAULT_CALL_TIMEOUT = 30.0

T = TypeVar("T")
_UNSET: Any = object()


def default_address() -> str:
    """``$CYCLONE_ADDRESS`` or 127.0.0.1:50051."""
    return os.environ.get("CYCLONE_ADDRESS") or DEFAULT_ADDRESS


def call_metadata(token: str | None, actor: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata sent with every call: the bearer token and the audit actor."""
    md: list[tuple[str, str]] = []
    if token:
        md.append(("authorization", f"Bearer {token}"))
    if actor:
        md.append(("cyclone-actor", actor))
    return tuple(md)


#: A start time: an aware datetime, or a delay from now.
StartAt = dt.datetime | dt.timedelta


def _set_flow(
    req: wf_pb.SubmitRequest | wf_pb.SubmitOnceRequest, start_at: StartAt | None, priority: int
) -> None:
    """Start time and priority of a submit, checked as the server checks them."""
    try:
        flow.check_priority("run", priority)
    except dag.InvalidWorkflow as exc:
        raise InvalidArgument(str(exc)) from None
    req.priority = priority
    if start_at is None:
        return
    if isinstance(start_at, dt.timedelta):
        start_at = dt.datetime.now(dt.UTC) + start_at
    if start_at.tzinfo is None:
        raise InvalidArgument("start_at must be an aware datetime (with a time zone)")
    req.start_at.FromDatetime(start_at)


@dataclass(frozen=True, slots=True)
class _Call(Generic[T]):
    """One RPC to make: which service and method, the request, how to read the answer."""

    service: str  # "workflow", "admin" or "schedule"
    method: str
    request: pb_message.Message
    parse: Callable[[Any], T]


class _calls:
    @staticmethod
    def submit(
        workflow: Workflow, input: Any, start_at: StartAt | None = None, priority: int = 0
    ) -> _Call[str]:
        req = wf_pb.SubmitRequest(workflow=workflow.to_proto())
        _set_value(req, "input", input, "run input")
        _set_flow(req, start_at, priority)
        return _Call("workflow", "Submit", req, lambda r: r.run_id)

    @staticmethod
    def submit_once(
        workflow: Workflow,
        key: str,
        input: Any,
        start_at: StartAt | None = None,
        priority: int = 0,
    ) -> _Call[Submitted]:
        try:
            dag.check_submit_key(key)
        except dag.InvalidWorkflow as exc:
            raise InvalidArgument(str(exc)) from None
        req = wf_pb.SubmitOnceRequest(workflow=workflow.to_proto(), key=key)
        _set_value(req, "input", input, "run input")
        _set_flow(req, start_at, priority)
        return _Call("workflow", "SubmitOnce", req, lambda r: Submitted(r.run_id, r.created))

    @staticmethod
    def start(
        name: str | Callable[..., Any],
        input: Any,
        key: str | None,
        timeout: float | dt.timedelta | None,
        retry: RetryPolicy | None,
    ) -> _Call[str]:
        """Submit (SubmitOnce with a key) the one-node workflow of a durable function:
        workflow, node and action named after it."""
        if not isinstance(name, str):
            name = getattr(name, "__cyclone_action__", None) or name.__name__
        wf = Workflow(name)
        wf.node(name, action=name, timeout=timeout, retry=retry)
        if key is None:
            return _calls.submit(wf, input)
        once = _calls.submit_once(wf, key, input)
        return _Call(once.service, once.method, once.request, lambda r: r.run_id)

    @staticmethod
    def get_run(run_id: str, logs: bool = False) -> _Call[Run]:
        req = wf_pb.GetRunRequest(run_id=run_id, logs=logs)
        return _Call("workflow", "GetRun", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def list_runs(
        workflow: str | None,
        status: str | Iterable[str] | None,
        created_after: dt.datetime | None,
        created_before: dt.datetime | None,
        page_size: int | None,
        page_token: str,
        key: str | None = None,
    ) -> _Call[RunPage]:
        req = wf_pb.ListRunsRequest(page_size=page_size or 0, page_token=page_token)
        _set_run_filters(req, workflow, status, created_after, created_before, key)

        def parse(r: wf_pb.ListRunsResponse) -> RunPage:
            return RunPage(tuple(Run.from_proto(p) for p in r.runs), r.next_page_token)

        return _Call("workflow", "ListRuns", req, parse)

    @staticmethod
    def count_runs(
        workflow: str | None,
        status: str | Iterable[str] | None,
        created_after: dt.datetime | None,
        created_before: dt.datetime | None,
        key: str | None,
        limit: int | None,
    ) -> _Call[dict[str, RunCount]]:
        req = wf_pb.CountRunsRequest(limit=limit or 0)
        _set_run_filters(req, workflow, status, created_after, created_before, key)

        def parse(r: wf_pb.CountRunsResponse) -> dict[str, RunCount]:
            return {str(c.status): c for c in map(RunCount.from_proto, r.counts)}

        return _Call("workflow", "CountRuns", req, parse)

    @staticmethod
    def list_steps(
        status: str | None,
        lease_expired: bool,
        backing_off: bool,
        worker_id: str | None,
        action: str | None,
        page_size: int | None,
        page_token: str,
    ) -> _Call[StepPage]:
        if status is not None and status not in StepStatus.__members__.values():
            raise InvalidArgument(f"unknown step status {status!r}")
        code = f"STEP_STATUS_{status.upper()}" if status else "STEP_STATUS_UNSPECIFIED"
        req = wf_pb.ListStepsRequest(
            status=code,
            lease_expired=lease_expired,
            backing_off=backing_off,
            worker_id=worker_id or "",
            action=action or "",
            page_size=page_size or 0,
            page_token=page_token,
        )

        def parse(r: wf_pb.ListStepsResponse) -> StepPage:
            steps = tuple(RunStep(s.run_id, s.workflow, Step.from_proto(s.step)) for s in r.steps)
            return StepPage(steps, r.next_page_token)

        return _Call("workflow", "ListSteps", req, parse)

    @staticmethod
    def list_workers() -> _Call[Workers]:
        def parse(r: wf_pb.ListWorkersResponse) -> Workers:
            return Workers(
                tuple(WorkerSummary.from_proto(w) for w in r.workers),
                tuple(ActionActivity.from_proto(a) for a in r.actions),
            )

        return _Call("workflow", "ListWorkers", wf_pb.ListWorkersRequest(), parse)

    @staticmethod
    def cancel(run_id: str, reason: str, keep_children: bool) -> _Call[Run]:
        req = wf_pb.CancelRunRequest(run_id=run_id, reason=reason, keep_children=keep_children)
        return _Call("workflow", "CancelRun", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def send_event(run_id: str, name: str, payload: Any, key: str | None) -> _Call[EventSent]:
        req = wf_pb.SendEventRequest(run_id=run_id, name=name, key=key or "")
        _set_value(req, "payload", payload, "the event's payload")
        return _Call(
            "workflow", "SendEvent", req, lambda r: EventSent(int(r.event_id), bool(r.created))
        )

    @staticmethod
    def explain(run_id: str, node: str) -> _Call[Explanation]:
        req = wf_pb.ExplainRequest(run_id=run_id, node=node)
        return _Call("workflow", "Explain", req, Explanation.from_proto)

    @staticmethod
    def retry(run_id: str, node: str, reason: str) -> _Call[Run]:
        req = admin_pb.RetryRequest(run_id=run_id, node=node, reason=reason)
        return _Call("admin", "Retry", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def retry_all(run_id: str, reason: str) -> _Call[Retried]:
        req = admin_pb.RetryAllRequest(run_id=run_id, reason=reason)
        return _Call(
            "admin", "RetryAll", req, lambda r: Retried(tuple(r.nodes), Run.from_proto(r.run))
        )

    @staticmethod
    def resolve(
        run_id: str,
        node: str,
        result: Any,
        error: str | None,
        discard: bool,
        reason: str,
        step_id: str | None,
    ) -> _Call[Run]:
        chosen = [result is not _UNSET, error is not None, bool(discard)]
        if sum(chosen) != 1:
            raise InvalidArgument("resolve needs exactly one of result=, error= or discard=True")
        if not node and not step_id:
            raise InvalidArgument("resolve needs the node, or the step_id of a step call")
        req = admin_pb.ResolveRequest(
            run_id=run_id, node=node, reason=reason, step_id=step_id or ""
        )
        if result is not _UNSET:
            _set_value(req, "result", result, "result", allow_null=True)
        elif error is not None:
            req.error = error
        else:
            req.discard = True
        return _Call("admin", "Resolve", req, lambda r: Run.from_proto(r.run))


_OVERLAP = {"skip": schedule_pb.OVERLAP_POLICY_SKIP, "allow": schedule_pb.OVERLAP_POLICY_ALLOW}
_CATCH_UP = {"skip": schedule_pb.CATCH_UP_POLICY_SKIP, "all": schedule_pb.CATCH_UP_POLICY_ALL}


class _schedule_calls:
    @staticmethod
    def create(
        name: str,
        workflow: Workflow,
        input: Any,
        cron: str | None,
        time_zone: str | None,
        every: float | dt.timedelta | None,
        overlap: str,
        catch_up: str,
        paused: bool,
    ) -> _Call[Schedule]:
        if (cron is None) == (every is None):
            raise InvalidArgument("give exactly one of cron and every")
        if overlap not in _OVERLAP:
            raise InvalidArgument(f"overlap must be one of {sorted(_OVERLAP)}, got {overlap!r}")
        if catch_up not in _CATCH_UP:
            raise InvalidArgument(f"catch_up must be one of {sorted(_CATCH_UP)}, got {catch_up!r}")
        s = schedule_pb.Schedule(
            name=name,
            workflow=workflow.to_proto(),
            time_zone=time_zone or "",
            overlap=_OVERLAP[overlap],
            catch_up=_CATCH_UP[catch_up],
            paused=paused,
        )
        if cron is not None:
            s.cron = cron
        else:
            seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
            s.interval.FromNanoseconds(round(float(seconds or 0) * 1e9))
        _set_value(s, "input", input, "run input")
        req = schedule_pb.CreateScheduleRequest(schedule=s)
        return _Call("schedule", "CreateSchedule", req, _schedule)

    @staticmethod
    def one(method: str, name: str) -> _Call[Schedule]:
        req = getattr(schedule_pb, f"{method}Request")(name=name)
        return _Call("schedule", method, req, _schedule)

    @staticmethod
    def list(page_size: int | None, page_token: str | None) -> _Call[SchedulePage]:
        req = schedule_pb.ListSchedulesRequest(
            page_size=page_size or 0, page_token=page_token or ""
        )

        def parse(r: schedule_pb.ListSchedulesResponse) -> SchedulePage:
            return SchedulePage(
                tuple(Schedule.from_proto(s) for s in r.schedules), r.next_page_token
            )

        return _Call("schedule", "ListSchedules", req, parse)

    @staticmethod
    def delete(name: str) -> _Call[None]:
        req = schedule_pb.DeleteScheduleRequest(name=name)
        return _Call("schedule", "DeleteSchedule", req, lambda r: None)


def _set_run_filters(
    req: wf_pb.ListRunsRequest | wf_pb.CountRunsRequest,
    workflow: str | None,
    status: str | Iterable[str] | None,
    created_after: dt.datetime | None,
    created_before: dt.datetime | None,
    key: str | None,
) -> None:
    """ListRuns' and CountRuns' filters."""
    statuses = [status] if isinstance(status, str) else list(status or ())
    try:
        req.statuses.extend(RunStatus(s).to_proto() for s in statuses)
    except ValueError:
        raise InvalidArgument(
            f"unknown run status in {statuses}; expected some of "
            f"{', '.join(s.value for s in RunStatus)}"
        ) from None
    req.workflow = workflow or ""
    req.key = key or ""
    if created_after is not None:
        req.created_after.FromDatetime(created_after)
    if created_before is not None:
        req.created_before.FromDatetime(created_before)


def _schedule(r: Any) -> Schedule:
    return Schedule.from_proto(r.schedule)


def _set_value(
    req: pb_message.Message, field: str, value: Any, what: str, allow_null: bool = False
) -> None:
    if value is None and not allow_null:
        return
    try:
        getattr(req, field).CopyFrom(to_value(value))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} is not JSON: {exc}") from None


class _Waiter:
    """The polling schedule of wait(): 50 ms doubling up to ``cap``, until ``timeout``."""

    def __init__(self, run_id: str, timeout: float | None, cap: float):
        self.run_id, self.timeout, self.cap = run_id, timeout, cap
        self.end = None if timeout is None else time.monotonic() + timeout
        self.delay = 0.05

    def pause_after(self, run: Run) -> float | None:
        """None when ``run`` is done waiting for; else how long to sleep before the next poll."""
        if run.status != RunStatus.RUNNING:
            return None
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        if self.end is None:
            return delay
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"run {self.run_id} is still {run.status} after {self.timeout:g}s")
        return min(delay, remaining)


def _stubs(channel: Any) -> dict[str, Any]:
    return {
        "workflow": wf_grpc.WorkflowServiceStub(channel),
        "admin": admin_grpc.AdminServiceStub(channel),
        "schedule": schedule_grpc.ScheduleServiceStub(channel),
    }


class Client:
    """A synchronous client. Use as a context manager, or call :meth:`close`.

    ``token`` is sent as ``authorization: Bearer <token>``; ``actor`` as
    ``cyclone-actor`` metadata, recorded in the audit trail of operator actions when
    the server has no authenticated identity. ``credentials`` makes a TLS channel.
    ``channel`` replaces the channel altogether (tests use a fake one).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        actor: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        channel: grpc.Channel | None = None,
    ):
        self.address = address or default_address()
        if channel is None:
            channel = (
                grpc.secure_channel(self.address, credentials)
                if credentials
                else grpc.insecure_channel(self.address)
            )
        self._channel = channel
        self._stubs = _stubs(channel)
        self._metadata = call_metadata(token, actor)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _invoke(self, call: _Call[T]) -> T:
        rpc = getattr(self._stubs[call.service], call.method)
        try:
            response = rpc(call.request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return call.parse(response)

    def submit(
        self,
        workflow: Workflow,
        input: Any = None,
        *,
        start_at: StartAt | None = None,
        priority: int = 0,
    ) -> str:
        """Validate ``workflow``, start a new run with ``input``, return its run id.
        ``start_at`` (an aware datetime, or a timedelta from now) makes its first steps
        claimable only then; ``priority`` orders its steps among the ready ones (higher
        first; docs/flow-control.md)."""
        return self._invoke(_calls.submit(workflow, input, start_at, priority))

    def submit_once(
        self,
        workflow: Workflow,
        key: str,
        input: Any = None,
        *,
        start_at: StartAt | None = None,
        priority: int = 0,
    ) -> Submitted:
        """At most one run per (workflow name, key): the new run or the existing one.
        ``start_at`` and ``priority`` as for :meth:`submit`."""
        return self._invoke(_calls.submit_once(workflow, key, input, start_at, priority))

    def start(
        self,
        name: str | Callable[..., Any],
        input: Any = None,
        key: str | None = None,
        *,
        timeout: float | dt.timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> str:
        """Run the durable function registered as ``name`` (``@worker.workflow``; or
        the function itself): a one-node workflow named ``name`` whose node ``name``
        calls the action ``name``. With ``key``, at most one run per (name, key)
        (SubmitOnce): a second call returns the first run's id. ``timeout`` and
        ``retry`` are the node's (per attempt; default 5 minutes and 3 attempts).
        Returns the run id; :meth:`wait` waits for its outcome."""
        return self._invoke(_calls.start(name, input, key, timeout, retry))

    def get_run(self, run_id: str, *, logs: bool = False) -> Run:
        """The run with every step and its audit trail; NotFound for an unknown id.
        ``logs``: each step's log lines too (Step.logs)."""
        return self._invoke(_calls.get_run(run_id, logs))

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | Iterable[str] | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        page_size: int | None = None,
        page_token: str = "",
        key: str | None = None,
    ) -> RunPage:
        """One page of runs, newest first, without their steps (``key``: the run
        SubmitOnce made with it, one per workflow)."""
        return self._invoke(
            _calls.list_runs(
                workflow, status, created_after, created_before, page_size, page_token, key
            )
        )

    def count_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | Iterable[str] | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> dict[str, RunCount]:
        """Runs per status, exact up to ``limit`` (server default 1,000)."""
        return self._invoke(
            _calls.count_runs(workflow, status, created_after, created_before, key, limit)
        )

    def list_steps(
        self,
        *,
        status: str | None = None,
        lease_expired: bool = False,
        backing_off: bool = False,
        worker_id: str | None = None,
        action: str | None = None,
        page_size: int | None = None,
        page_token: str = "",
    ) -> StepPage:
        """Steps across runs: ``status="running"`` (``lease_expired`` for those whose
        lease ran out), or ``backing_off=True``; by worker and action, paged."""
        return self._invoke(
            _calls.list_steps(
                status, lease_expired, backing_off, worker_id, action, page_size, page_token
            )
        )

    def list_workers(self) -> Workers:
        """The workers holding steps, and every action's activity."""
        return self._invoke(_calls.list_workers())

    def iter_runs(self, *, limit: int | None = None, **filters: Any) -> Iterator[Run]:
        """Every run matching the filters of :meth:`list_runs`, page after page."""
        token, seen = "", 0
        while True:
            page = self.list_runs(page_token=token, **filters)
            for run in page.runs:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield run
            token = page.next_page_token
            if not token:
                return

    def cancel(self, run_id: str, reason: str = "", *, keep_children: bool = False) -> Run:
        """Cancel an unfinished run; its running handlers learn it at their next heartbeat.
        Its running or blocked child runs (start_child), theirs and so on, are cancelled
        with it unless ``keep_children``."""
        return self._invoke(_calls.cancel(run_id, reason, keep_children))

    def send_event(
        self, run_id: str, name: str, payload: Any = None, key: str | None = None
    ) -> EventSent:
        """Send the event ``name`` with a JSON ``payload`` to a run: kept until a wait
        for it consumes it (``wait_for_event`` in a body, a DAG node with an event),
        each event once; a node waiting for it resumes at once. With ``key``, a repeat
        sends nothing and returns the first event (``created`` False)."""
        return self._invoke(_calls.send_event(run_id, name, payload, key))

    def explain(self, run_id: str, node: str) -> Explanation:
        """Why ``node`` is not running now: waiting on upstream nodes, backing off,
        leased (to whom, last heartbeat), blocked, skipped (because of which failure),
        or ready with no worker asking for its action. NotFound for an unknown node."""
        return self._invoke(_calls.explain(run_id, node))

    def retry(self, run_id: str, node: str, reason: str = "") -> Run:
        """Reopen a discarded node in place (same run and node; next attempt)."""
        return self._invoke(_calls.retry(run_id, node, reason))

    def retry_all(self, run_id: str, reason: str = "") -> Retried:
        """Reopen every discarded node of the run."""
        return self._invoke(_calls.retry_all(run_id, reason))

    def resolve(
        self,
        run_id: str,
        node: str = "",
        *,
        result: Any = _UNSET,
        error: str | None = None,
        discard: bool = False,
        reason: str = "",
        step_id: str | None = None,
    ) -> Run:
        """Resolve the uncertain step of a blocked run: exactly one of ``result=``
        (the effect happened; this is its output), ``error=`` (it happened and
        failed) or ``discard=True`` (it did not happen; run the step again).

        For a run blocked on a step call of a durable function (``run.error.step_id``)
        give its ``step_id``: then ``result=`` records the call's return value,
        ``error=`` its failure (the body's replay raises StepFailed with type_name
        ``"EffectFailed"``, so its except runs) and ``discard=True``
        deletes its entry (it runs on replay); the node replays either way. ``node``
        may then be left out: the run's blocked node. ``reason`` is recorded in the
        audit trail with the actor."""
        return self._invoke(_calls.resolve(run_id, node, result, error, discard, reason, step_id))

    # Schedules (docs/schedules.md) ---------------------------------------------------

    def create_schedule(
        self,
        name: str,
        workflow: Workflow,
        input: Any = None,
        *,
        cron: str | None = None,
        time_zone: str | None = None,
        every: float | dt.timedelta | None = None,
        overlap: str = "skip",
        catch_up: str = "skip",
        paused: bool = False,
    ) -> Schedule:
        """Keep a schedule on the server that submits ``workflow`` with ``input``: on
        ``cron`` (five fields, or six with seconds first) in ``time_zone`` (IANA, default
        UTC), or ``every`` so many seconds (whole seconds, at multiples of the interval
        since the epoch). ``overlap``: ``"skip"`` a firing while the last run still
        runs, or ``"allow"`` it; ``catch_up``: ``"skip"`` firings missed during
        downtime, or submit ``"all"`` of them (the 100 most recent at most)."""
        return self._invoke(
            _schedule_calls.create(
                name, workflow, input, cron, time_zone, every, overlap, catch_up, paused
            )
        )

    def get_schedule(self, name: str) -> Schedule:
        return self._invoke(_schedule_calls.one("GetSchedule", name))

    def list_schedules(
        self, *, page_size: int | None = None, page_token: str | None = None
    ) -> SchedulePage:
        """One page of schedules, in name order."""
        return self._invoke(_schedule_calls.list(page_size, page_token))

    def pause_schedule(self, name: str) -> Schedule:
        """Stop the schedule from firing until :meth:`resume_schedule`."""
        return self._invoke(_schedule_calls.one("PauseSchedule", name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire again from the next fire time after now (no catch-up of the pause)."""
        return self._invoke(_schedule_calls.one("ResumeSchedule", name))

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule; the runs it submitted stay."""
        self._invoke(_schedule_calls.delete(name))

    def wait(self, run_id: str, timeout: float | None = None, *, poll_cap: float = 1.0) -> Run:
        """Poll until the run is completed, failed, cancelled or blocked; return it.

        A blocked run is returned too: it needs an operator, nothing else moves it.
        Raises WaitTimeout after ``timeout`` seconds (None: wait for ever).
        """
        waiter = _Waiter(run_id, timeout, poll_cap)
        while True:
            run = self.get_run(run_id)
            pause = waiter.pause_after(run)
            if pause is None:
                return run
            time.sleep(pause)


class AsyncClient:
    """The asyncio twin of :class:`Client`, on a ``grpc.aio`` channel."""

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        actor: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        channel: grpc.aio.Channel | None = None,
    ):
        self.address = address or default_address()
        if channel is None:
            channel = (
                grpc.aio.secure_channel(self.address, credentials)
                if credentials
                else grpc.aio.insecure_channel(self.address)
            )
        self._channel = channel
        self._stubs = _stubs(channel)
        self._metadata = call_metadata(token, actor)
        self.timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _invoke(self, call: _Call[T]) -> T:
        rpc = getattr(self._stubs[call.service], call.method)
        try:
            response = await rpc(call.request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return call.parse(response)

    async def submit(
        self,
        workflow: Workflow,
        input: Any = None,
        *,
        start_at: StartAt | None = None,
        priority: int = 0,
    ) -> str:
        return await self._invoke(_calls.submit(workflow, input, start_at, priority))

    async def submit_once(
        self,
        workflow: Workflow,
        key: str,
        input: Any = None,
        *,
        start_at: StartAt | None = None,
        priority: int = 0,
    ) -> Submitted:
        return await self._invoke(_calls.submit_once(workflow, key, input, start_at, priority))

    async def start(
        self,
        name: str | Callable[..., Any],
        input: Any = None,
        key: str | None = None,
        *,
        timeout: float | dt.timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> str:
        return await self._invoke(_calls.start(name, input, key, timeout, retry))

    async def get_run(self, run_id: str, *, logs: bool = False) -> Run:
        return await self._invoke(_calls.get_run(run_id, logs))

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | Iterable[str] | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        page_size: int | None = None,
        page_token: str = "",
        key: str | None = None,
    ) -> RunPage:
        return await self._invoke(
            _calls.list_runs(
                workflow, status, created_after, created_before, page_size, page_token, key
            )
        )

    async def count_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | Iterable[str] | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> dict[str, RunCount]:
        """Runs per status (all statuses unless ``status`` names some), exact up to
        ``limit`` (server default 1,000), else ``at_least``."""
        return await self._invoke(
            _calls.count_runs(workflow, status, created_after, created_before, key, limit)
        )

    async def list_steps(
        self,
        *,
        status: str | None = None,
        lease_expired: bool = False,
        backing_off: bool = False,
        worker_id: str | None = None,
        action: str | None = None,
        page_size: int | None = None,
        page_token: str = "",
    ) -> StepPage:
        """Steps across runs: ``status="running"`` (``lease_expired`` for those whose
        lease ran out), or ``backing_off=True``."""
        return await self._invoke(
            _calls.list_steps(
                status, lease_expired, backing_off, worker_id, action, page_size, page_token
            )
        )

    async def list_workers(self) -> Workers:
        return await self._invoke(_calls.list_workers())

    async def iter_runs(self, *, limit: int | None = None, **filters: Any) -> AsyncIterator[Run]:
        token, seen = "", 0
        while True:
            page = await self.list_runs(page_token=token, **filters)
            for run in page.runs:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield run
            token = page.next_page_token
            if not token:
                return

    async def cancel(self, run_id: str, reason: str = "", *, keep_children: bool = False) -> Run:
        return await self._invoke(_calls.cancel(run_id, reason, keep_children))

    async def send_event(
        self, run_id: str, name: str, payload: Any = None, key: str | None = None
    ) -> EventSent:
        return await self._invoke(_calls.send_event(run_id, name, payload, key))

    async def explain(self, run_id: str, node: str) -> Explanation:
        return await self._invoke(_calls.explain(run_id, node))

    async def retry(self, run_id: str, node: str, reason: str = "") -> Run:
        return await self._invoke(_calls.retry(run_id, node, reason))

    async def retry_all(self, run_id: str, reason: str = "") -> Retried:
        return await self._invoke(_calls.retry_all(run_id, reason))

    async def resolve(
        self,
        run_id: str,
        node: str = "",
        *,
        result: Any = _UNSET,
        error: str | None = None,
        discard: bool = False,
        reason: str = "",
        step_id: str | None = None,
    ) -> Run:
        return await self._invoke(
            _calls.resolve(run_id, node, result, error, discard, reason, step_id)
        )

    async def create_schedule(
        self,
        name: str,
        workflow: Workflow,
        input: Any = None,
        *,
        cron: str | None = None,
        time_zone: str | None = None,
        every: float | dt.timedelta | None = None,
        overlap: str = "skip",
        catch_up: str = "skip",
        paused: bool = False,
    ) -> Schedule:
        return await self._invoke(
            _schedule_calls.create(
                name, workflow, input, cron, time_zone, every, overlap, catch_up, paused
            )
        )

    async def get_schedule(self, name: str) -> Schedule:
        return await self._invoke(_schedule_calls.one("GetSchedule", name))

    async def list_schedules(
        self, *, page_size: int | None = None, page_token: str | None = None
    ) -> SchedulePage:
        return await self._invoke(_schedule_calls.list(page_size, page_token))

    async def pause_schedule(self, name: str) -> Schedule:
        return await self._invoke(_schedule_calls.one("PauseSchedule", name))

    async def resume_schedule(self, name: str) -> Schedule:
        return await self._invoke(_schedule_calls.one("ResumeSchedule", name))

    async def delete_schedule(self, name: str) -> None:
        await self._invoke(_schedule_calls.delete(name))

    async def wait(
        self, run_id: str, timeout: float | None = None, *, poll_cap: float = 1.0
    ) -> Run:
        waiter = _Waiter(run_id, timeout, poll_cap)
        while True:
            run = await self.get_run(run_id)
            pause = waiter.pause_after(run)
            if pause is None:
                return run
            await asyncio.sleep(pause)
