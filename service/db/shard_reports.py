"""Completions on a sharded database (Citus, docs/scaling.md): a batch of outcomes
applied by shard, each shard's part in one call delegated to the node that holds it
(step_complete_shard), and the parent wakes that child runs finished there owed,
delivered after the commit (child_wakes, 95_shards.sql)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from service import errors
from service.db.completion import batch_answer, logs_items, outcomes_json
from service.db.pool import Pool, Repository
from service.db.records import Completion, Outcome, Refused

log = logging.getLogger("cyclone")

#: Runs whose shard a server remembers (learnt from its claims and lookups) before it
#: forgets them all and starts again: a shard id and a run id are some 100 bytes.
SHARDS_KEPT = 200_000


class ShardRow(NamedTuple):
    """step_complete_shard: one row per item, and what the call owes after it commits."""

    i: int
    step_status: str | None
    run_status: str | None
    duplicate: bool | None
    retry_at: datetime | None
    error_state: str | None
    error_message: str | None
    error_detail: str | None
    ready: str | None
    woken: str | None


class Shards(NamedTuple):
    """shards_of."""

    shards: list[int]


class Ready(NamedTuple):
    """child_wake."""

    ready: str | None


class Done(NamedTuple):
    """child_wake_done."""

    child_wake_done: object


class Owed(NamedTuple):
    """child_wakes_pending: a parent wake a child run still owes."""

    run_id: str
    parent_run_id: str


def remember_shards(pool: Pool, runs: Sequence[tuple[str, int]]) -> None:
    """Keep the shard of each run (canonical id text) a claim met, so that its outcome is
    grouped without asking the database."""
    kept = pool.shard_of
    if len(kept) + len(runs) > SHARDS_KEPT:
        kept.clear()
    kept.update(runs)


class ShardReports(Repository):
    """Outcomes applied where their runs live."""

    async def complete(self, outcomes: Sequence[Outcome]) -> list[Completion | Refused]:
        """Apply outcomes (step_complete_many's answers, in order): the outcomes of each
        shard in one delegated call, a single-shard transaction on its node (when the
        server routes, those of the shards one node holds in one call and one
        transaction there, step_complete_node; the nodes' calls at once). A call that
        fails (its node down) fails the whole request once the other calls are
        answered: those committed stay, a worker that sends the batch again is
        answered duplicate for them, and the parent wakes they owe are delivered."""
        shards = await self._shards([o.run_id for o in outcomes])
        groups: dict[int | None, list[int]] = {}
        for index, shard in enumerate(shards):
            groups.setdefault(shard, []).append(index)
        answers: list[Completion | Refused | None] = [None] * len(outcomes)
        woken: list[str] = []
        calls: list[tuple[Pool | None, int | None, list[int]]] = []
        for node, held in self.pool.by_node(groups):
            if node is not None and len(held) > 1:
                calls.append((node, None, [k for s in held for k in groups[s]]))
            else:
                calls += [(None, s, groups[s]) for s in held]
        # The calls to other nodes at once (each on a connection of its node's), then
        # those of this pool's node one after the other on ``driver``; a call that
        # fails fails the request once the others' answers are taken in.
        routed: list[tuple[Pool | None, int | None, list[int]]] = []
        local: list[tuple[Pool | None, int | None, list[int]]] = []
        for c in calls:
            (routed if c[0] is not None or self.pool.node_of(c[1]) is not None else local).append(c)
        async with self._connection_if(bool(local)) as driver:
            done: list[list[ShardRow] | BaseException] = await asyncio.gather(
                *(self._complete_call(driver, outcomes, shards, *c) for c in routed),
                return_exceptions=True,
            )
            results = [(c[2], answer) for c, answer in zip(routed, done, strict=True)]
            for c in local:
                if any(isinstance(answer, BaseException) for answer in done):
                    break
                try:
                    results.append((c[2], await self._complete_call(driver, outcomes, shards, *c)))
                except Exception as exc:
                    results.append((c[2], exc))
                    break
        failed: BaseException | None = None
        for indexes, rows in results:
            if isinstance(rows, BaseException):
                failed = failed or rows
                continue
            for row in rows:
                answers[indexes[row.i]] = batch_answer(row)
            self._published(r.ready for r in rows)
            woken += {pair for r in rows if r.woken for pair in r.woken.split(",")}
        if woken:
            await self.wake_parents(woken)
        if failed is not None:
            raise failed
        # A missing answer is a bug, answered INTERNAL.
        assert all(a is not None for a in answers)
        return answers  # type: ignore[return-value]

    def _complete_call(
        self,
        driver: psycopg.AsyncConnection[Any] | None,
        outcomes: Sequence[Outcome],
        shards: list[int | None],
        node: Pool | None,
        shard: int | None,
        indexes: list[int],
    ) -> Awaitable[list[ShardRow]]:
        """The call applying the outcomes ``indexes``: those of every shard ``node``
        holds in one call there (step_complete_node), or those of ``shard`` in one call
        on the node that holds it, else on ``driver`` (step_complete_shard)."""
        group = [outcomes[k] for k in indexes]
        if node is not None:
            return node._all(
                "step_complete_node",
                ShardRow,
                items=outcomes_json(group),
                shards=[shards[k] for k in indexes],
                logs=logs_items(group),
            )
        return self._on_shard(
            driver,
            shard,
            "step_complete_shard",
            ShardRow,
            run_id=group[0].run_id,
            items=outcomes_json(group),
            logs=logs_items(group),
        )

    async def _shards(self, runs: list[str]) -> list[int | None]:
        """The shard of each run: remembered from claims, else known from its id where
        the server routes (Pool.shard_for), else asked once for all (for a batch of one
        run, None: the call finds it)."""
        kept = self.pool.shard_of

        def known(run_id: str) -> int | None:
            shard = kept.get(run_id)
            return self.pool.shard_for(run_id) if shard is None else shard

        if len(set(runs)) == 1:
            return [known(runs[0])] * len(runs)
        found = {r: known(r) for r in runs}
        unknown = [r for r, shard in found.items() if shard is None]
        if unknown:
            row = await self._one("shards_of", Shards, runs=unknown)
            assert row is not None
            found.update(zip(unknown, row.shards, strict=True))
            remember_shards(self.pool, list(zip(unknown, row.shards, strict=True)))
        return [found[r] for r in runs]

    async def wake_parents(self, pairs: Sequence[str]) -> int:
        """Deliver the parent wakes ("parent:child") that finished child runs owe: the
        parent's nodes waiting for each child woken (child_wake, on the parent's node),
        then the debt forgotten (child_wake_done, on the child's). One that fails is
        left for the sweep (wakes_owed). Returns how many were delivered."""
        delivered = 0
        for pair in pairs:
            parent, _, child = pair.partition(":")
            try:
                await self._all("child_wake", Ready, run_id=parent, child=child)
                await self._all("child_wake_done", Done, run_id=child)
            except errors.CycloneError as exc:
                log.warning(
                    "the wake of run %s by its child %s is left for the sweep: %s",
                    parent,
                    child,
                    exc,
                    extra={"run_id": parent},
                )
                continue
            delivered += 1
        return delivered

    async def wakes_owed(self, limit: int) -> int:
        """The sweep's part: deliver up to ``limit`` parent wakes that a crash or an
        unreachable node left owed; returns how many were delivered."""
        owed = await self._all("child_wakes_pending", Owed, limit=limit)
        return await self.wake_parents([f"{o.parent_run_id}:{o.run_id}" for o in owed])
