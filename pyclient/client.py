"""Client and AsyncClient: submit workflows, inspect and steer runs.

Both speak to the WorkflowService and the AdminService. Each method is described
once (request, RPC, how to read the answer) by the functions of
:mod:`pyclient._requests`; the two classes (:class:`Client` here, its asyncio twin in
:mod:`pyclient.async_client`) only differ in how they wait. gRPC errors are raised as
pyclient.errors exceptions that keep the server's message.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from pyclient._bulk import bulk_calls
from pyclient._callbacks import CallbackMethods
from pyclient._requests import (
    DEFAULT_ADDRESS,
    DEFAULT_CALL_TIMEOUT,
    UNSET,
    Call,
    StartAt,
    T,
    Waiter,
    call_metadata,
    calls,
    default_address,
    stubs,
)
from pyclient._run_messages import RunMessageMethods
from pyclient._schedule_calls import schedule_calls
from pyclient._streams import StreamChunk, StreamSummary, list_call, read_request, read_sync
from pyclient._tracing import SUBMITS, with_context
from pyclient.async_client import AsyncClient
from pyclient.errors import from_rpc_error
from pyclient.models import (
    Build,
    BuildMoved,
    BuildRun,
    BulkAction,
    BulkPage,
    BulkStarted,
    EventSent,
    Explanation,
    NamePause,
    Paused,
    Retried,
    Run,
    RunCount,
    RunPage,
    Schedule,
    SchedulePage,
    StepPage,
    Submitted,
    Workers,
    WorkflowDeadline,
)
from pyclient.workflow import RetryPolicy, Workflow

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_CALL_TIMEOUT",
    "AsyncClient",
    "Client",
    "StartAt",
    "call_metadata",
    "default_address",
]


class Client(CallbackMethods, RunMessageMethods):
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
        self._stubs = stubs(channel)
        self._metadata = call_metadata(token, actor)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _invoke(self, call: Call[T]) -> T:
        rpc = getattr(self._stubs[call.service], call.method)
        try:
            metadata = self._metadata
            if call.method in SUBMITS:  # the run continues the caller's trace
                metadata = with_context(metadata)
            response = rpc(call.request, timeout=self.timeout + call.wait, metadata=metadata)
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
        tags: Mapping[str, str] | None = None,
        deadline: StartAt | None = None,
    ) -> str:
        """Validate ``workflow``, start a new run with ``input``, return its run id.
        ``start_at`` (an aware datetime, or a timedelta from now) makes its first steps
        claimable only then; ``priority`` orders its steps among the ready ones (higher
        first; docs/flow-control.md); ``tags`` (key = value strings, at most 16) label it
        for list_runs and count_runs; at ``deadline`` (an aware datetime, or a timedelta
        from now; default: the workflow's default deadline, if any) the run is
        cancelled (docs/time-and-events.md)."""
        return self._invoke(calls.submit(workflow, input, start_at, priority, tags, deadline))

    def submit_once(
        self,
        workflow: Workflow,
        key: str,
        input: Any = None,
        *,
        start_at: StartAt | None = None,
        priority: int = 0,
        tags: Mapping[str, str] | None = None,
        deadline: StartAt | None = None,
    ) -> Submitted:
        """At most one run per (workflow name, key): the new run or the existing one
        (which keeps its own tags). ``start_at``, ``priority``, ``tags`` and ``deadline``
        as for :meth:`submit`."""
        return self._invoke(
            calls.submit_once(workflow, key, input, start_at, priority, tags, deadline)
        )

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
        return self._invoke(calls.start(name, input, key, timeout, retry))

    def get_run(self, run_id: str, *, logs: bool = False, logs_node: str = "") -> Run:
        """The run with every step and its audit trail; NotFound for an unknown id.
        ``logs``: each step's log lines too (Step.logs); ``logs_node``: with ``logs``,
        only that node's."""
        return self._invoke(calls.get_run(run_id, logs, logs_node))

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
        run_id_prefix: str | None = None,
        workflow_prefix: str | None = None,
        key_prefix: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """One page of runs, newest first, without their steps (``key``: the run
        SubmitOnce made with it, one per workflow; ``tags``: runs carrying every one of
        them, at most 4)."""
        return self._invoke(
            calls.list_runs(
                workflow,
                status,
                created_after,
                created_before,
                page_size,
                page_token,
                key,
                {
                    "run_id_prefix": run_id_prefix,
                    "workflow_prefix": workflow_prefix,
                    "key_prefix": key_prefix,
                },
                tags,
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
        run_id_prefix: str | None = None,
        workflow_prefix: str | None = None,
        key_prefix: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> dict[str, RunCount]:
        """Runs per status, exact up to ``limit`` (server default 1,000)."""
        return self._invoke(
            calls.count_runs(
                workflow,
                status,
                created_after,
                created_before,
                key,
                limit,
                {
                    "run_id_prefix": run_id_prefix,
                    "workflow_prefix": workflow_prefix,
                    "key_prefix": key_prefix,
                },
                tags,
            )
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
        ready: bool = False,
    ) -> StepPage:
        """Steps across runs: ``status="running"`` (``lease_expired`` for those whose
        lease ran out), ``backing_off=True``, or ``ready=True`` with an ``action`` (its
        steps ready now, waiting for a worker); by worker and action, paged."""
        return self._invoke(
            calls.list_steps(
                status, lease_expired, backing_off, worker_id, action, page_size, page_token, ready
            )
        )

    def list_workers(self) -> Workers:
        """The workers holding steps, and every action's activity."""
        return self._invoke(calls.list_workers())

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
        return self._invoke(calls.cancel(run_id, reason, keep_children))

    def send_event(
        self, run_id: str, name: str, payload: Any = None, key: str | None = None
    ) -> EventSent:
        """Send the event ``name`` with a JSON ``payload`` to a run: kept until a wait
        for it consumes it (``wait_for_event`` in a body, a DAG node with an event),
        each event once; a node waiting for it resumes at once. With ``key``, a repeat
        sends nothing and returns the first event (``created`` False)."""
        return self._invoke(calls.send_event(run_id, name, payload, key))

    def explain(self, run_id: str, node: str) -> Explanation:
        """Why ``node`` is not running now: waiting on upstream nodes, backing off,
        leased (to whom, last heartbeat), blocked, skipped (because of which failure),
        or ready with no worker asking for its action. NotFound for an unknown node."""
        return self._invoke(calls.explain(run_id, node))

    def retry(self, run_id: str, node: str, reason: str = "") -> Run:
        """Reopen a discarded node in place (same run and node; next attempt)."""
        return self._invoke(calls.retry(run_id, node, reason))

    def set_run_tags(
        self,
        run_id: str,
        set: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        reason: str = "",
    ) -> Run:
        """Change a run's tags (admin; recorded in its audit trail): the keys of
        ``remove`` go, then ``set``'s keys take their values."""
        return self._invoke(calls.set_run_tags(run_id, set, remove, reason))

    def start_bulk(
        self,
        action: str,
        *,
        reason: str = "",
        dry_run: bool = False,
        confirm_all: bool = False,
        **filters: Any,
    ) -> BulkStarted:
        """Start a bulk action: ``action`` (``"cancel"``, ``"retry"`` or
        ``"resolve_discard"``) on every run the filters match, those of list_runs
        (workflow, status, created_after, created_before, key, run_id_prefix,
        workflow_prefix, key_prefix, tags). The server works through it; get_bulk tells how
        far it got. ``dry_run`` counts the runs and starts nothing; no filter at all
        needs ``confirm_all``."""
        return self._invoke(
            bulk_calls.start(
                action, reason=reason, dry_run=dry_run, confirm_all=confirm_all, **filters
            )
        )

    def get_bulk(self, job_id: str) -> BulkAction:
        """A bulk action and its progress."""
        return self._invoke(bulk_calls.get(job_id))

    def list_bulk(self, page_size: int | None = None, page_token: str = "") -> BulkPage:
        """One page of bulk actions, newest first."""
        return self._invoke(bulk_calls.list(page_size, page_token))

    def cancel_bulk(self, job_id: str) -> BulkAction:
        """Stop a running bulk action; the runs it acted on stay as they are."""
        return self._invoke(bulk_calls.cancel(job_id))

    def wait_bulk(self, job_id: str, *, poll: float = 0.5) -> BulkAction:
        """The bulk action once it is done or cancelled, read every ``poll`` seconds."""
        while True:
            job = self.get_bulk(job_id)
            if not job.running:
                return job
            time.sleep(poll)

    def retry_all(self, run_id: str, reason: str = "") -> Retried:
        """Reopen every discarded node of the run."""
        return self._invoke(calls.retry_all(run_id, reason))

    def resolve(
        self,
        run_id: str,
        target: str = "",
        *,
        result: Any = UNSET,
        error: str | None = None,
        discard: bool = False,
        reason: str = "",
        node: str | None = None,
        step_id: str | None = None,
    ) -> Run:
        """Resolve what blocks a blocked run: exactly one of ``result=`` (the effect
        happened; this is its output), ``error=`` (it happened and failed) or
        ``discard=True`` (it did not happen; run it again).

        ``target`` is what ``cyclone resolve RUN TARGET`` takes: the step id when the
        run is blocked on a step call of a durable function (``run.error.step_id``),
        the blocked node otherwise; this reads the run to tell which (``node=`` names
        the node of the step call instead, and then no read is needed). The node of a
        run blocked on a step call is sent as the node, which the server refuses with
        the step id to give. For a step
        call, ``result=`` records the call's return value, ``error=`` its failure (the
        body's replay raises StepFailed with type_name ``"EffectFailed"``, so its except
        runs) and ``discard=True`` deletes its entry (it runs on replay).

        Given ``step_id=``, ``target`` (or ``node=``) is the node of the step call, and
        may be left out: the run's blocked node. ``node=`` alone is the blocked node.
        ``reason`` (optional) is recorded in the audit trail with the actor."""
        call = calls.resolve_target(
            target, node, step_id, [result is not UNSET, error is not None, bool(discard)]
        )
        if call.lookup:
            blocked = self.get_run(run_id).error
            call = call.on(blocked.node if blocked else None, blocked.step_id if blocked else None)
        return self._invoke(
            calls.resolve(run_id, call.node, result, error, discard, reason, call.step_id)
        )

    # Builds (docs/durable-functions.md, "Build pinning") -------------------------------

    def list_builds(self) -> list[Build]:
        """Every build workers declared, oldest first: its compatibility set, the
        workers seen with it, its unfinished nodes with a journal, retired or not."""
        return self._invoke(calls.list_builds())

    def list_build_runs(self, build_id: str, *, limit: int = 100) -> list[BuildRun]:
        """The runs with unfinished nodes pinned to ``build_id`` (NotFound if unknown)."""
        return self._invoke(calls.list_build_runs(build_id, limit))

    def set_build_compatible(self, build_id: str, compatible_with: str, reason: str = "") -> Build:
        """Make ``build_id`` compatible with ``compatible_with``: it joins that build's
        set, and the workers of each take the nodes pinned to the other."""
        return self._invoke(calls.set_build_compatible(build_id, compatible_with, reason))

    def retire_build(self, build_id: str, reason: str = "") -> Build:
        """Retire a build: its workers are handed nothing from then on."""
        return self._invoke(calls.retire_build(build_id, reason))

    def move_build(self, from_build_id: str, to_build_id: str, reason: str = "") -> BuildMoved:
        """Move the unfinished nodes pinned to a retired build to another build."""
        return self._invoke(calls.move_build(from_build_id, to_build_id, reason))

    # Pauses -----------------------------------------------------------------------

    def pause_run(self, run_id: str, reason: str = "") -> Paused:
        """Pause a running or blocked run: no step of it is claimed until resume_run;
        running steps go on. ``changed`` is False when it was paused already."""
        return self._invoke(calls.pause_run(run_id, reason))

    def resume_run(self, run_id: str, reason: str = "") -> Paused:
        """Resume a paused run: its held steps are claimable again. ``changed`` is
        False when it was not paused."""
        return self._invoke(calls.resume_run(run_id, reason))

    def pause_workflow(self, name: str, reason: str = "") -> NamePause:
        """Pause a workflow: no server hands out a step of any run of it until
        resume_workflow."""
        return self._invoke(calls.pause_name("workflow", name, reason, True))

    def resume_workflow(self, name: str, reason: str = "") -> NamePause:
        """Resume a paused workflow."""
        return self._invoke(calls.pause_name("workflow", name, reason, False))

    def pause_action(self, name: str, reason: str = "") -> NamePause:
        """Pause an action (a handler name): no server hands out a step of it, in any
        run, until resume_action."""
        return self._invoke(calls.pause_name("action", name, reason, True))

    def resume_action(self, name: str, reason: str = "") -> NamePause:
        """Resume a paused action."""
        return self._invoke(calls.pause_name("action", name, reason, False))

    def list_pauses(self) -> list[NamePause]:
        """The workflows and actions paused now: workflows first, each by name."""
        return self._invoke(calls.list_pauses())

    # Default deadlines of workflows (docs/time-and-events.md) ---------------------------

    def set_workflow_deadline(
        self, workflow: str, deadline: float | dt.timedelta, reason: str = ""
    ) -> WorkflowDeadline:
        """Set the default deadline of ``workflow`` (seconds, or a timedelta): its runs
        submitted without a deadline are cancelled this long after their submit."""
        return self._invoke(calls.set_workflow_deadline(workflow, deadline, reason))

    def clear_workflow_deadline(self, workflow: str, reason: str = "") -> WorkflowDeadline:
        """Clear the default deadline of ``workflow``; the one cleared (NotFound if none)."""
        return self._invoke(calls.clear_workflow_deadline(workflow, reason))

    def list_workflow_deadlines(self) -> list[WorkflowDeadline]:
        """Every workflow's default deadline, by name."""
        return self._invoke(calls.list_workflow_deadlines())

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
        tags: Mapping[str, str] | None = None,
    ) -> Schedule:
        """Keep a schedule on the server that submits ``workflow`` with ``input`` and
        ``tags`` (as :meth:`submit`'s): on ``cron`` (5 fields, or 6 with seconds first)
        in ``time_zone`` (IANA, default UTC), or ``every`` so many whole seconds (at
        multiples of it since the epoch). ``overlap``: ``"skip"`` a firing while the
        last run runs, or ``"allow"`` it; ``catch_up``: ``"skip"`` firings missed in
        downtime, or submit ``"all"`` (the 100 most recent at most)."""
        return self._invoke(
            schedule_calls.create(
                name, workflow, input, cron, time_zone, every, overlap, catch_up, paused, tags
            )
        )

    def get_schedule(self, name: str) -> Schedule:
        return self._invoke(schedule_calls.one("GetSchedule", name))

    def list_schedules(
        self, *, page_size: int | None = None, page_token: str | None = None
    ) -> SchedulePage:
        """One page of schedules, in name order."""
        return self._invoke(schedule_calls.list(page_size, page_token))

    def pause_schedule(self, name: str) -> Schedule:
        """Stop the schedule from firing until :meth:`resume_schedule`."""
        return self._invoke(schedule_calls.one("PauseSchedule", name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire again from the next fire time after now (no catch-up of the pause)."""
        return self._invoke(schedule_calls.one("ResumeSchedule", name))

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule; the runs it submitted stay."""
        self._invoke(schedule_calls.delete(name))

    def read_stream(
        self,
        run_id: str,
        name: str,
        offset: int = 0,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> Iterator[StreamChunk]:
        """The chunks of the run's output stream ``name`` from ``offset``, in order: those
        stored, then (with ``wait``) each new one as it is stored, until the run is
        finished and all were read (docs/streams.md). ``wait=False`` stops after those
        stored now. ``timeout`` bounds the whole read (None: none). Stopping the
        iteration early ends the call."""
        request = read_request(run_id, name, offset, wait)
        return read_sync(self._stubs["workflow"], request, self._metadata, timeout)

    def list_streams(self, run_id: str) -> list[StreamSummary]:
        """The run's output streams by name, with their chunks and bytes."""
        return self._invoke(list_call(run_id))

    def wait(self, run_id: str, timeout: float | None = None, *, poll_cap: float = 1.0) -> Run:
        """Poll until the run is completed, failed, cancelled or blocked; return it.

        A blocked run is returned too: it needs an operator, nothing else moves it.
        Raises WaitTimeout after ``timeout`` seconds (None: wait for ever).
        """
        waiter = Waiter(run_id, timeout, poll_cap)
        while True:
            run = self.get_run(run_id)
            pause = waiter.pause_after(run)
            if pause is None:
                return run
            time.sleep(pause)
