"""Queries and updates of durable functions: WorkflowService.QueryRun and UpdateRun
(asked by clients), WorkerService.Inbox (where the workers running the bodies take
them and answer). See docs/durable-functions.md, "Queries and updates"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import struct_pb2

from cyclone.jsonvalue import parsed_value
from cyclone.v1 import worker_service_pb2 as worker_pb
from cyclone.v1 import workflow_service_pb2 as workflow_pb
from service import errors
from service.api import convert
from service.api.ids import parse_uuid
from service.api.status import rpc
from service.api.validate import (
    MAX_ERROR_TEXT,
    Context,
    actor_of,
    node_name,
    seconds,
    step_call_name,
    text,
)
from service.db import Database
from service.engine.notify import Dispatcher

#: QueryRun's default and longest wait for the worker's answer, in seconds.
QUERY_TIMEOUT = 10.0
MAX_QUERY_TIMEOUT = 60.0
#: How long a query may wait to be taken by the worker running its node. Workers that
#: serve queries long-poll Inbox with every body they run and renew the poll at least
#: every 2s; a query nobody took by then goes to no worker that can answer it.
QUERY_DELIVERY = 5.0
#: UpdateRun's default and longest wait for the update to be applied, in seconds.
UPDATE_TIMEOUT = 30.0
MAX_UPDATE_TIMEOUT = 300.0
#: The longest update id (its journal entry's step_id is "update:" and the id).
MAX_UPDATE_ID = 150
#: Inbox: the longest wait, and the most nodes one request names.
MAX_INBOX_WAIT = 30.0
MAX_INBOX_NODES = 10_000
#: The journal's function of an update's application.
UPDATE_FUNCTION = "cyclone.update"
#: The dispatcher's name for "a query or an update came for this run".
INBOX_PREFIX = "cyclone.inbox:"
#: Node statuses in which the node is over.
_FINISHED = frozenset({"completed", "discarded", "skipped", "cancelled"})
_RUN_OVER = frozenset({"completed", "failed", "cancelled"})
#: _answered's "no worker took the query within QUERY_DELIVERY".
_UNTAKEN = object()


def _timeout(message: Any, default: float, longest: float) -> float:
    if not message.HasField("timeout"):
        return default
    wait = seconds(message.timeout)
    if not 0.001 <= wait <= longest:
        raise errors.InvalidArgument(f"timeout must be between 1ms and {longest:g}s, got {wait:g}s")
    return wait


def _args_json(args: struct_pb2.ListValue, payloads: convert.Payloads) -> str:
    value = struct_pb2.Value()
    value.list_value.CopyFrom(args)
    return payloads.to_json(value, "args")


def _value(obj: Any) -> struct_pb2.Value:
    return parsed_value(obj)


async def _polled(check: Callable[[], Awaitable[Any]], deadline: float) -> Any:
    """``check()`` until it returns something, with a short growing pause between
    looks; None at the deadline."""
    pause = 0.02
    while True:
        found = await check()
        if found is not None:
            return found
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 1.5, 0.25)


def _handler_error(error: dict[str, Any], kind: str, name: str, node: str) -> errors.CycloneError:
    """The status of a handler's error as the worker or the journal recorded it."""
    etype = str(error.get("type") or "Error")
    message = str(error.get("message") or "")
    if etype in ("UnknownQuery", "UnknownUpdate"):
        return errors.NotFound(message or f"the body of node {node} has no {kind} handler {name!r}")
    return errors.FailedPrecondition(
        f"the {kind} handler {name!r} of node {node} raised {etype}: {message}"
    )


class RunMessages:
    """WorkflowService.QueryRun and UpdateRun (a base of WorkflowServicer)."""

    db: Database
    payloads: convert.Payloads

    @rpc
    async def QueryRun(
        self, request: workflow_pb.QueryRunRequest, context: Context
    ) -> workflow_pb.QueryRunResponse:
        run_id = parse_uuid(request.run_id)
        node = node_name(request.node)
        name = step_call_name(request.name, "name")
        args = _args_json(request.args, self.payloads)
        wait = _timeout(request, QUERY_TIMEOUT, MAX_QUERY_TIMEOUT)
        where = await self.db.queries.query_node(run_id, node)
        if where is None:
            raise errors.NotFound(f"run {run_id} not found")
        if where.node_status is None:
            raise errors.NotFound(f"run {run_id} has no node {node}")
        if where.node_status == "running":
            query_id = await self.db.queries.query_ask(run_id, node, name, args, wait)
            asked = time.monotonic()
            try:
                answer = await _polled(
                    lambda: self._answered(run_id, query_id, asked), asked + wait
                )
            finally:
                await self.db.queries.query_forget(run_id, query_id)
            if answer is None:
                raise errors.DeadlineExceeded(
                    f"the worker running node {node} of run {run_id} did not answer query "
                    f"{name!r} within {wait:g}s"
                )
            if answer is _UNTAKEN:
                return await self._published(run_id, node, name, request, untaken=True)
            stopped = answer.error is not None and answer.error.get("type") == "NotRunning"
            if not stopped:
                if answer.error is not None:
                    raise _handler_error(answer.error, "query", name, node)
                return workflow_pb.QueryRunResponse(result=_value(answer.result))
            # The body stopped on its worker meanwhile (it waits now, say): what it
            # published answers, as for a node no worker runs.
        return await self._published(run_id, node, name, request, status=where.node_status)

    async def _published(
        self,
        run_id: uuid.UUID,
        node: str,
        name: str,
        request: workflow_pb.QueryRunRequest,
        *,
        status: str = "running",
        untaken: bool = False,
    ) -> workflow_pb.QueryRunResponse:
        """QueryRun when no worker runs the node, or none took the query (``untaken``):
        the value its body last published."""
        if untaken:
            why = (
                f"no worker took query {name!r} of node {node} of run {run_id} within "
                f"{QUERY_DELIVERY:g}s: the node runs a plain handler, or a durable function "
                "whose worker serves no queries (its SDK has none, or it cannot reach Inbox)"
            )
        else:
            why = f"no worker is running node {node} of run {run_id} (it is {status})"
        if len(request.args.values):
            raise errors.FailedPrecondition(
                f"{why}: a query with arguments needs one; without arguments it is answered "
                "from the values the body published"
            )
        published = await self.db.queries.query_state_get(run_id, node, name)
        if published is None:
            raise errors.FailedPrecondition(
                f"{why}, and its body published no value for query {name!r}"
            )
        return workflow_pb.QueryRunResponse(
            result=_value(published.value),
            published=True,
            published_at=convert.timestamp(published.published_at),
        )

    async def _answered(self, run_id: uuid.UUID, query_id: int, asked: float) -> Any:
        """The answer once there; _UNTAKEN when no worker took the query in time."""
        row = await self.db.queries.query_answer(run_id, query_id)
        if row is not None and row.answered:
            return row
        if (row is None or not row.delivered) and time.monotonic() - asked >= QUERY_DELIVERY:
            return _UNTAKEN
        return None

    @rpc
    async def UpdateRun(
        self, request: workflow_pb.UpdateRunRequest, context: Context
    ) -> workflow_pb.UpdateRunResponse:
        run_id = parse_uuid(request.run_id)
        node = node_name(request.node)
        name = step_call_name(request.name, "name")
        args = _args_json(request.args, self.payloads)
        wait = _timeout(request, UPDATE_TIMEOUT, MAX_UPDATE_TIMEOUT)
        if request.update_id:
            update_id = step_call_name(request.update_id, "update_id")
            text(update_id, "update_id", MAX_UPDATE_ID)
        else:
            update_id = str(uuid.uuid4())
        sent = await self.db.queries.update_send(
            run_id, node, update_id, name, args, actor_of(context)
        )
        if not sent.created and (sent.name != name or sent.args != json.loads(args)):
            raise errors.AlreadyExists(
                f"update {update_id!r} of node {node} was sent as {sent.name!r} with other "
                "arguments; give this update an id of its own"
            )
        outcome = await _polled(
            lambda: self._applied(run_id, node, update_id), time.monotonic() + wait
        )
        if outcome is None:
            raise errors.DeadlineExceeded(
                f"update {update_id!r} of node {node} is recorded but was not applied within "
                f"{wait:g}s (the body applies it at its next step call or wait); call again "
                "with the same update_id for its outcome"
            )
        if outcome.seq is None:
            raise errors.FailedPrecondition(
                f"node {node} of run {run_id} finished ({outcome.node_status}) before its body "
                f"applied update {update_id!r}"
            )
        output = outcome.output if isinstance(outcome.output, dict) else {}
        if "error" in output:
            raise _handler_error(output["error"] or {}, "update", name, node)
        return workflow_pb.UpdateRunResponse(
            result=_value(output.get("result")),
            update_id=update_id,
            created=sent.created,
            seq=outcome.seq,
        )

    async def _applied(self, run_id: uuid.UUID, node: str, update_id: str) -> Any:
        """The update's journal entry (and its node), once there or once the node is
        over without it; None meanwhile."""
        row = await self.db.queries.update_outcome(run_id, node, update_id)
        if row is None:
            raise errors.NotFound(f"run {run_id} has no node {node}")
        if row.seq is not None or row.node_status in _FINISHED or row.run_status in _RUN_OVER:
            return row
        return None


class WorkerInbox:
    """WorkerService.Inbox (a base of WorkerServicer)."""

    db: Database
    dispatcher: Dispatcher
    payloads: convert.Payloads
    stopping: asyncio.Event

    @rpc
    async def Inbox(
        self, request: worker_pb.InboxRequest, context: Context
    ) -> worker_pb.InboxResponse:
        if len(request.nodes) > MAX_INBOX_NODES:
            raise errors.InvalidArgument(
                f"an Inbox names at most {MAX_INBOX_NODES} nodes, got {len(request.nodes)}"
            )
        wait = seconds(request.wait) if request.HasField("wait") else 0.0
        if not 0 <= wait <= MAX_INBOX_WAIT:
            raise errors.InvalidArgument(
                f"wait must be between 0s and {MAX_INBOX_WAIT:g}s, got {wait:g}s"
            )
        answers = []
        for a in request.answers:
            answer: dict[str, Any] = {"run_id": str(parse_uuid(a.run_id)), "query_id": a.query_id}
            if a.error_type:
                error = {
                    "type": text(a.error_type, "error_type", 200),
                    "message": text(a.error_message, "error_message", MAX_ERROR_TEXT),
                }
                answers.append({**answer, "result": None, "error": error})
            else:
                result = self.payloads.to_python(a.result, "a query's result")
                answers.append({**answer, "result": result, "error": None})
        await self.db.queries.inbox_answer(answers)
        published = [
            {
                "run_id": str(parse_uuid(p.run_id)),
                "node": node_name(p.node),
                "attempt": p.attempt,
                "name": step_call_name(p.name, "name"),
                "value": self.payloads.to_python(p.value, "a published query value"),
            }
            for p in request.published
        ]
        await self.db.queries.inbox_publish(published)
        nodes = [
            (str(parse_uuid(n.run_id)), node_name(n.node), n.after_update) for n in request.nodes
        ]
        names = sorted({INBOX_PREFIX + n[0] for n in nodes})
        deadline = time.monotonic() + wait
        with self.dispatcher.subscribe(names) as woken:
            while True:
                woken.clear()
                queries, updates = await self.db.queries.inbox_pending(nodes)
                left = deadline - time.monotonic()
                if queries or updates or left <= 0 or self.stopping.is_set():
                    break
                # A look at least every second: a wake-up lost with a LISTEN connection
                # delays a query by that much at most.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), min(left, 1.0))
        response = worker_pb.InboxResponse()
        for q in queries:
            item = response.queries.add(
                query_id=q.query_id, run_id=str(q.run_id), node=q.node, name=q.name
            )
            item.args.extend(q.args or [])
        for u in updates:
            update = response.updates.add(
                seq=u.seq, run_id=str(u.run_id), node=u.node, update_id=u.update_id, name=u.name
            )
            update.args.extend(u.args or [])
        return response
