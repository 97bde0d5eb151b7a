"""Queries and updates of durable functions: asked and sent by clients (QueryRun,
UpdateRun), handed out to and answered by the workers running the bodies (Inbox)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from service.db.pool import Repository


class UpdateSent(NamedTuple):
    """update_send: whether this call recorded it, the update as recorded."""

    created: bool
    name: str
    args: Any
    ready: str | None


class UpdateOutcome(NamedTuple):
    """The node an update was sent to, and the update's journal entry (None: not yet)."""

    node_status: str
    run_status: str
    seq: int | None
    call_status: str | None
    output: Any


class QueryNode(NamedTuple):
    """The node a query asks (node_status None: the run has no such node)."""

    node_status: str | None
    run_status: str


class Asked(NamedTuple):
    """query_ask: the query's id; the name the run's Inbox calls wait for."""

    query_id: int
    ready: str | None


class Answer(NamedTuple):
    answered: bool
    delivered: bool
    result: Any
    error: Any


class Published(NamedTuple):
    value: Any
    published_at: datetime


class RunOf(NamedTuple):
    run_id: uuid.UUID


class Forgotten(NamedTuple):
    query_id: int


class PendingQuery(NamedTuple):
    query_id: int
    run_id: uuid.UUID
    node: str
    name: str
    args: Any


class PendingUpdate(NamedTuple):
    seq: int
    run_id: uuid.UUID
    node: str
    update_id: str
    name: str
    args: Any


class Queries(Repository):
    """Queries and updates of durable functions."""

    async def update_send(
        self, run_id: uuid.UUID, node: str, update_id: str, name: str, args_json: str, actor: str
    ) -> UpdateSent:
        row = await self._one(
            "update_send",
            UpdateSent,
            run_id=str(run_id),
            node=node,
            update_id=update_id,
            update_name=name,
            args=args_json,
            actor=actor,
        )
        assert row is not None
        return row

    async def update_outcome(
        self, run_id: uuid.UUID, node: str, update_id: str
    ) -> UpdateOutcome | None:
        return await self._one(
            "update_outcome",
            UpdateOutcome,
            run_id=str(run_id),
            node=node,
            step_id=f"update:{update_id}",
        )

    async def query_node(self, run_id: uuid.UUID, node: str) -> QueryNode | None:
        return await self._one("query_node", QueryNode, run_id=str(run_id), node=node)

    async def query_ask(
        self, run_id: uuid.UUID, node: str, name: str, args_json: str, timeout_s: float
    ) -> int:
        row = await self._one(
            "query_ask",
            Asked,
            run_id=str(run_id),
            node=node,
            query_name=name,
            args=args_json,
            timeout_s=timeout_s,
        )
        assert row is not None
        return row.query_id

    async def query_answer(self, run_id: uuid.UUID, query_id: int) -> Answer | None:
        return await self._one("query_answer", Answer, run_id=str(run_id), query_id=query_id)

    async def query_forget(self, run_id: uuid.UUID, query_id: int) -> None:
        await self._all("query_forget", Forgotten, run_id=str(run_id), query_id=query_id)

    async def query_state_get(self, run_id: uuid.UUID, node: str, name: str) -> Published | None:
        return await self._one(
            "query_state_get", Published, run_id=str(run_id), node=node, query_name=name
        )

    async def inbox_answer(self, items: Sequence[dict[str, Any]]) -> set[uuid.UUID]:
        """Store a worker's answers; the runs whose queries were answered."""
        if not items:
            return set()
        rows = await self._all("inbox_answer", RunOf, items=json.dumps(list(items)))
        return {r.run_id for r in rows}

    async def inbox_publish(self, items: Sequence[dict[str, Any]]) -> None:
        if items:
            await self._all("inbox_publish", RunOf, items=json.dumps(list(items)))

    async def inbox_pending(
        self, nodes: Sequence[tuple[str, str, int]]
    ) -> tuple[list[PendingQuery], list[PendingUpdate]]:
        """The queries (handed out now) and updates waiting for these nodes:
        (run_id, node, after_update) each."""
        if not nodes:
            return [], []
        run_ids = [n[0] for n in nodes]
        names = [n[1] for n in nodes]
        queries = await self._all("inbox_queries", PendingQuery, run_ids=run_ids, nodes=names)
        updates = await self._all(
            "inbox_updates",
            PendingUpdate,
            run_ids=run_ids,
            nodes=names,
            afters=[n[2] for n in nodes],
        )
        return queries, updates
