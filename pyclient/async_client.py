"""AsyncClient: the asyncio twin of :class:`~pyclient.client.Client`, on a ``grpc.aio``
channel; the requests both make are in :mod:`pyclient._requests`."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc

from pyclient import _run_messages as run_messages
from pyclient._bulk import bulk_calls
from pyclient._callbacks import AsyncCallbackMethods
from pyclient._requests import (
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
from pyclient._run_messages import QueryAnswer, UpdateResult
from pyclient._schedule_calls import schedule_calls
from pyclient._streams import StreamChunk, StreamSummary, list_call, read_async, read_request
from pyclient._tracing import SUBMITS, with_context
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


class AsyncClient(AsyncCallbackMethods):
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
        self._stubs = stubs(channel)
        self._metadata = call_metadata(token, actor)
        self.timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _invoke(self, call: Call[T]) -> T:
        rpc = getattr(self._stubs[call.service], call.method)
        try:
            metadata = self._metadata
            if call.method in SUBMITS:  # the run continues the caller's trace
                metadata = with_context(metadata)
            response = await rpc(call.request, timeout=self.timeout + call.wait, metadata=metadata)
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
        tags: Mapping[str, str] | None = None,
        deadline: StartAt | None = None,
    ) -> str:
        return await self._invoke(calls.submit(workflow, input, start_at, priority, tags, deadline))

    async def submit_once(
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
        return await self._invoke(
            calls.submit_once(workflow, key, input, start_at, priority, tags, deadline)
        )

    async def start(
        self,
        name: str | Callable[..., Any],
        input: Any = None,
        key: str | None = None,
        *,
        timeout: float | dt.timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> str:
        return await self._invoke(calls.start(name, input, key, timeout, retry))

    async def get_run(self, run_id: str, *, logs: bool = False, logs_node: str = "") -> Run:
        """As Client.get_run."""
        return await self._invoke(calls.get_run(run_id, logs, logs_node))

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
        run_id_prefix: str | None = None,
        workflow_prefix: str | None = None,
        key_prefix: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        return await self._invoke(
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

    async def count_runs(
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
        """Runs per status (all statuses unless ``status`` names some), exact up to
        ``limit`` (server default 1,000), else ``at_least``."""
        return await self._invoke(
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
        ready: bool = False,
    ) -> StepPage:
        """Steps across runs: ``status="running"`` (``lease_expired`` for those whose
        lease ran out), ``backing_off=True``, or ``ready=True`` with an ``action`` (its
        steps ready now, waiting for a worker)."""
        return await self._invoke(
            calls.list_steps(
                status, lease_expired, backing_off, worker_id, action, page_size, page_token, ready
            )
        )

    async def list_workers(self) -> Workers:
        return await self._invoke(calls.list_workers())

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
        return await self._invoke(calls.cancel(run_id, reason, keep_children))

    async def send_event(
        self, run_id: str, name: str, payload: Any = None, key: str | None = None
    ) -> EventSent:
        return await self._invoke(calls.send_event(run_id, name, payload, key))

    async def query(
        self, run_id: str, node: str, name: str, *args: Any, timeout: float | None = None
    ) -> QueryAnswer:
        """As Client.query."""
        return await self._invoke(run_messages.query_run(run_id, node, name, args, timeout))

    async def update(
        self,
        run_id: str,
        node: str,
        name: str,
        *args: Any,
        update_id: str | None = None,
        timeout: float | None = None,
    ) -> UpdateResult:
        """As Client.update."""
        return await self._invoke(
            run_messages.update_run(run_id, node, name, args, update_id, timeout)
        )

    async def explain(self, run_id: str, node: str) -> Explanation:
        return await self._invoke(calls.explain(run_id, node))

    async def retry(self, run_id: str, node: str, reason: str = "") -> Run:
        return await self._invoke(calls.retry(run_id, node, reason))

    async def set_run_tags(
        self,
        run_id: str,
        set: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        reason: str = "",
    ) -> Run:
        """Change a run's tags (admin; recorded in its audit trail): the keys of
        ``remove`` go, then ``set``'s keys take their values."""
        return await self._invoke(calls.set_run_tags(run_id, set, remove, reason))

    async def start_bulk(
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
        return await self._invoke(
            bulk_calls.start(
                action, reason=reason, dry_run=dry_run, confirm_all=confirm_all, **filters
            )
        )

    async def get_bulk(self, job_id: str) -> BulkAction:
        """A bulk action and its progress."""
        return await self._invoke(bulk_calls.get(job_id))

    async def list_bulk(self, page_size: int | None = None, page_token: str = "") -> BulkPage:
        """One page of bulk actions, newest first."""
        return await self._invoke(bulk_calls.list(page_size, page_token))

    async def cancel_bulk(self, job_id: str) -> BulkAction:
        """Stop a running bulk action; the runs it acted on stay as they are."""
        return await self._invoke(bulk_calls.cancel(job_id))

    async def wait_bulk(self, job_id: str, *, poll: float = 0.5) -> BulkAction:
        """The bulk action once it is done or cancelled, read every ``poll`` seconds."""
        while True:
            job = await self.get_bulk(job_id)
            if not job.running:
                return job
            await asyncio.sleep(poll)

    async def retry_all(self, run_id: str, reason: str = "") -> Retried:
        return await self._invoke(calls.retry_all(run_id, reason))

    async def resolve(
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
        """As :meth:`pyclient.Client.resolve`: ``target`` is a step id or a node, as
        for ``cyclone resolve``."""
        call = calls.resolve_target(
            target, node, step_id, [result is not UNSET, error is not None, bool(discard)]
        )
        if call.lookup:
            blocked = (await self.get_run(run_id)).error
            call = call.on(blocked.node if blocked else None, blocked.step_id if blocked else None)
        return await self._invoke(
            calls.resolve(run_id, call.node, result, error, discard, reason, call.step_id)
        )

    async def list_builds(self) -> list[Build]:
        return await self._invoke(calls.list_builds())

    async def list_build_runs(self, build_id: str, *, limit: int = 100) -> list[BuildRun]:
        return await self._invoke(calls.list_build_runs(build_id, limit))

    async def set_build_compatible(
        self, build_id: str, compatible_with: str, reason: str = ""
    ) -> Build:
        return await self._invoke(calls.set_build_compatible(build_id, compatible_with, reason))

    async def retire_build(self, build_id: str, reason: str = "") -> Build:
        return await self._invoke(calls.retire_build(build_id, reason))

    async def move_build(
        self, from_build_id: str, to_build_id: str, reason: str = ""
    ) -> BuildMoved:
        return await self._invoke(calls.move_build(from_build_id, to_build_id, reason))

    # Pauses -----------------------------------------------------------------------

    async def pause_run(self, run_id: str, reason: str = "") -> Paused:
        return await self._invoke(calls.pause_run(run_id, reason))

    async def resume_run(self, run_id: str, reason: str = "") -> Paused:
        return await self._invoke(calls.resume_run(run_id, reason))

    async def pause_workflow(self, name: str, reason: str = "") -> NamePause:
        return await self._invoke(calls.pause_name("workflow", name, reason, True))

    async def resume_workflow(self, name: str, reason: str = "") -> NamePause:
        return await self._invoke(calls.pause_name("workflow", name, reason, False))

    async def pause_action(self, name: str, reason: str = "") -> NamePause:
        return await self._invoke(calls.pause_name("action", name, reason, True))

    async def resume_action(self, name: str, reason: str = "") -> NamePause:
        return await self._invoke(calls.pause_name("action", name, reason, False))

    async def list_pauses(self) -> list[NamePause]:
        return await self._invoke(calls.list_pauses())

    # Default deadlines of workflows (docs/time-and-events.md) ---------------------------

    async def set_workflow_deadline(
        self, workflow: str, deadline: float | dt.timedelta, reason: str = ""
    ) -> WorkflowDeadline:
        return await self._invoke(calls.set_workflow_deadline(workflow, deadline, reason))

    async def clear_workflow_deadline(self, workflow: str, reason: str = "") -> WorkflowDeadline:
        return await self._invoke(calls.clear_workflow_deadline(workflow, reason))

    async def list_workflow_deadlines(self) -> list[WorkflowDeadline]:
        return await self._invoke(calls.list_workflow_deadlines())

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
        tags: Mapping[str, str] | None = None,
    ) -> Schedule:
        return await self._invoke(
            schedule_calls.create(
                name, workflow, input, cron, time_zone, every, overlap, catch_up, paused, tags
            )
        )

    async def get_schedule(self, name: str) -> Schedule:
        return await self._invoke(schedule_calls.one("GetSchedule", name))

    async def list_schedules(
        self, *, page_size: int | None = None, page_token: str | None = None
    ) -> SchedulePage:
        return await self._invoke(schedule_calls.list(page_size, page_token))

    async def pause_schedule(self, name: str) -> Schedule:
        return await self._invoke(schedule_calls.one("PauseSchedule", name))

    async def resume_schedule(self, name: str) -> Schedule:
        return await self._invoke(schedule_calls.one("ResumeSchedule", name))

    async def delete_schedule(self, name: str) -> None:
        await self._invoke(schedule_calls.delete(name))

    def read_stream(
        self,
        run_id: str,
        name: str,
        offset: int = 0,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """The chunks of the run's output stream ``name`` from ``offset``, as an async
        iterator: those stored, then (with ``wait``) each new one as it is stored, until
        the run is finished and all were read (docs/streams.md). See
        :meth:`Client.read_stream`."""
        request = read_request(run_id, name, offset, wait)
        return read_async(self._stubs["workflow"], request, self._metadata, timeout)

    async def list_streams(self, run_id: str) -> list[StreamSummary]:
        """The run's output streams by name, with their chunks and bytes."""
        return await self._invoke(list_call(run_id))

    async def wait(
        self, run_id: str, timeout: float | None = None, *, poll_cap: float = 1.0
    ) -> Run:
        waiter = Waiter(run_id, timeout, poll_cap)
        while True:
            run = await self.get_run(run_id)
            pause = waiter.pause_after(run)
            if pause is None:
                return run
            await asyncio.sleep(pause)
