"""Queries and updates of durable functions, as the clients call them
(``Client.query`` and ``Client.update``; docs/durable-functions.md, "Queries and
updates")."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from cyclone.jsonvalue import from_value, to_value
from cyclone.v1 import workflow_service_pb2 as wf_pb
from pyclient._requests import Call, T
from pyclient.errors import InvalidArgument
from pyclient.models import timestamp_datetime

#: The server's default waits (QueryRun, UpdateRun), in seconds.
QUERY_TIMEOUT = 10.0
UPDATE_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class QueryAnswer:
    """A query's answer: the handler's value; ``published`` when no worker ran the
    body and the value is the one it last published (at ``published_at``)."""

    result: Any
    published: bool = False
    published_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """An update's outcome: the handler's return value, the update's id, whether this
    call sent it (False: the id was sent before, this is that update's outcome), and
    the journal position where the body applied it."""

    result: Any
    update_id: str
    created: bool
    seq: int


def _args(args: Sequence[Any]) -> struct_pb2.ListValue:
    values = struct_pb2.ListValue()
    for i, arg in enumerate(args):
        try:
            values.values.append(to_value(arg))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"argument {i + 1} is not JSON: {exc}") from None
    return values


def _timeout(request: Any, timeout: float | None) -> float:
    if timeout is None:
        return 0.0
    request.timeout.FromNanoseconds(int(timeout * 1e9))
    return float(timeout)


def query_run(
    run_id: str, node: str, name: str, args: Sequence[Any], timeout: float | None
) -> Call[QueryAnswer]:
    req = wf_pb.QueryRunRequest(run_id=run_id, node=node, name=name, args=_args(args))
    wait = _timeout(req, timeout) or QUERY_TIMEOUT

    def parse(r: wf_pb.QueryRunResponse) -> QueryAnswer:
        at = timestamp_datetime(r.published_at) if r.HasField("published_at") else None
        return QueryAnswer(from_value(r.result), bool(r.published), at)

    return Call("workflow", "QueryRun", req, parse, wait=wait)


def update_run(
    run_id: str,
    node: str,
    name: str,
    args: Sequence[Any],
    update_id: str | None,
    timeout: float | None,
) -> Call[UpdateResult]:
    req = wf_pb.UpdateRunRequest(
        run_id=run_id, node=node, name=name, args=_args(args), update_id=update_id or ""
    )
    wait = _timeout(req, timeout) or UPDATE_TIMEOUT

    def parse(r: wf_pb.UpdateRunResponse) -> UpdateResult:
        return UpdateResult(from_value(r.result), r.update_id, bool(r.created), int(r.seq))

    return Call("workflow", "UpdateRun", req, parse, wait=wait)


class RunMessageMethods:
    """Client's methods for queries and updates (mixed into Client)."""

    def _invoke(self, call: Call[T]) -> T:
        raise NotImplementedError

    def query(
        self, run_id: str, node: str, name: str, *args: Any, timeout: float | None = None
    ) -> QueryAnswer:
        """Ask the query handler ``name`` of the durable function running ``node``
        (registered with ``ctx.query``), with JSON ``args``: answered by the worker
        running the body (read-only, not journaled) or, when none runs it, from the
        value the body last published (``published`` True). NotFound for an unknown
        handler; FailedPrecondition when nothing can answer; DeadlineExceeded when the
        worker did not answer within ``timeout`` seconds (default 10)."""
        return self._invoke(query_run(run_id, node, name, args, timeout))

    def update(
        self,
        run_id: str,
        node: str,
        name: str,
        *args: Any,
        update_id: str | None = None,
        timeout: float | None = None,
    ) -> UpdateResult:
        """Send the update ``name`` with JSON ``args`` to the durable function running
        ``node``; its handler (``ctx.update``) applies it at the body's next journal
        point, recorded in the journal (exactly once, also across crashes), and its
        return value is ``.result``. ``update_id`` is the idempotency key: a repeat
        sends nothing and returns the first update's outcome. FailedPrecondition when
        the handler raised or the run or node is finished; NotFound for an unknown
        handler; DeadlineExceeded when it was not applied within ``timeout`` seconds
        (default 30; it stays recorded: call again with the same id)."""
        return self._invoke(update_run(run_id, node, name, args, update_id, timeout))
