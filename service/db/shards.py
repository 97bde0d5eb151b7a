"""A sharded database (Citus, docs/scaling.md): the claim as Citus can run it, behind
the same seam (service.db.claim.Claim) as the plain one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import psycopg

from service import errors
from service.db.builds import BuildSet
from service.db.pool import Pool, Repository
from service.db.records import ClaimedStep
from service.db.shard_reports import remember_shards

T = TypeVar("T")


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


class ShardCandidate(NamedTuple):
    """step_candidates_on: a Candidate of one shard, with its place in claim order."""

    run_id: uuid.UUID
    node: str
    action: str
    shard: int
    concurrency_key: str | None
    concurrency_limit: int | None
    flow: bool
    priority: int
    due: float


class Representative(NamedTuple):
    """shard_representatives."""

    shard: int
    run_id: str


def _node_down(exc: psycopg.Error) -> bool:
    """Whether a statement failed because a node of the cluster could not be reached."""
    return (getattr(exc, "sqlstate", None) or "").startswith("08")


class _Tolerant:
    """Runs a claim's calls to shards: one whose node is down is passed over (an empty
    answer) and the others' steps are handed out (those claimed already are committed
    on their nodes)."""

    def __init__(self) -> None:
        self.down: list[Exception] = []
        self.answered = 0

    async def __call__(self, call: Callable[[], Awaitable[list[T]]]) -> list[T]:
        try:
            rows = await call()
        except psycopg.Error as exc:
            if not _node_down(exc):
                raise
            self.down.append(exc)
            return []
        except errors.Unavailable as exc:  # from a node the call was routed to
            self.down.append(exc)
            return []
        self.answered += 1
        return rows

    def check(self) -> None:
        """Unavailable when every call failed for its node being down."""
        if self.down and not self.answered:
            first = self.down[0]
            if isinstance(first, errors.Unavailable):
                raise first
            raise errors.Unavailable(detail=f"database unavailable: {first}")


class ShardedClaim(Repository):
    """Claims on a sharded database."""

    async def _builds(self, build_id: str | None) -> list[str] | None:
        """The builds whose pinned nodes a worker of ``build_id`` may take (empty without
        a build), or None when its build retired and it is handed nothing."""
        if build_id is None:
            return []
        row = await self._one("build_set", BuildSet, build_id=build_id)
        return None if row is None else row.builds

    async def claim(
        self,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease_s: float,
        flow: Mapping[str, list[Any]],
        build_id: str | None,
        shard_node: str | None,
    ) -> list[ClaimedStep]:
        """A claim on a sharded database (95_shards.sql): one read of the ready steps
        across shards (no locks; _candidates), then each shard's taken in one delegated
        call, a single-shard transaction (step_claim_shard, sent to the shard's node
        when the server routes: Pool.route; a node that holds several of the shards
        takes them all in one call and one transaction, step_claim_node), and those
        under flow control admitted under their locks on the coordinator
        (step_claim_flow). Twice the steps asked are read, as other servers may take
        some first. A worker marked unhealthy (a lease of it lapsed) gets nothing:
        asked by the first read, and by the shards' functions in the snapshot of their
        pick. A worker's build set is read first (on the coordinator, where the builds
        are) and passed to each. A worker pinned to a node (``shard_node``) reads and
        takes the runs of that node's shards only."""
        pinned = self.pool.named_holder(shard_node) if shard_node is not None else None
        builds = await self._builds(build_id)
        if builds is None:
            return []
        found = await self._candidates(worker_id, actions, limit * 2, builds, flow, pinned)
        remember_shards(self.pool, [(str(c.run_id), c.shard) for c in found])
        claimed: list[ClaimedStep] = []
        tolerant = _Tolerant()
        asked = {
            "worker_id": worker_id,
            "unsafe": unsafe,
            "lease_s": lease_s,
            "build_id": build_id,
            "builds": builds,
        }
        # A connection of this pool's node only for what is taken there.
        here = any(c.flow or self.pool.node_of(c.shard) is None for c in found)
        async with self._connection_if(here) as driver:
            # The first candidates in claim order, each shard's in one call; the next
            # ones, in the same way, while other servers took some of these first.
            pending = [c for c in found if not c.flow]
            while pending:
                left = limit - sum(not r.blocked for r in claimed)
                if left <= 0:
                    break
                claimed += await self._take(driver, tolerant, pending[:left], asked)
                pending = pending[left:]
            held = [c for c in found if c.flow]
            left = limit - sum(not r.blocked for r in claimed)
            if held and left > 0:
                assert driver is not None  # checked out for these (``here``)
                claimed += await tolerant(
                    lambda: self._run(
                        driver,
                        "step_claim_flow",
                        ClaimedStep,
                        runs=[str(c.run_id) for c in held],
                        nodes=[c.node for c in held],
                        actions=[c.action for c in held],
                        keys=[c.concurrency_key for c in held],
                        limits=[c.concurrency_limit for c in held],
                        worker_id=worker_id,
                        unsafe=unsafe,
                        lease_s=lease_s,
                        limit=left,
                        build_id=build_id,
                        builds=builds,
                        **flow,
                    )
                )
        tolerant.check()
        return claimed

    async def _take(
        self,
        driver: psycopg.AsyncConnection[Any] | None,
        tolerant: _Tolerant,
        taking: list[Candidate],
        asked: dict[str, Any],
    ) -> list[ClaimedStep]:
        """The candidates ``taking`` (in claim order) taken: each shard's in one call
        (step_claim_shard), or those of every shard a node holds in one call to it
        (step_claim_node). ``asked``: the worker and its claim's terms."""
        by_shard: dict[int, list[Candidate]] = {}
        for c in taking:
            by_shard.setdefault(c.shard, []).append(c)
        # The calls to other nodes at once (each on a connection of its node's): one
        # round trip for the claim, not one per node; then those of this pool's node,
        # one after the other on ``driver``.
        routed: list[Awaitable[list[ClaimedStep]]] = []
        here: list[int | None] = []
        for node, shards in self.pool.by_node(by_shard):
            if node is None:
                here += shards
            elif len(shards) > 1:
                group = [c for c in taking if c.shard in shards]
                routed.append(
                    tolerant(
                        lambda node=node, group=group: node._all(  # type: ignore[misc]
                            "step_claim_node",
                            ClaimedStep,
                            runs=[str(c.run_id) for c in group],
                            nodes=[c.node for c in group],
                            shards=[c.shard for c in group],
                            **asked,
                        )
                    )
                )
            else:
                routed.append(self._take_shard(driver, tolerant, shards[0], by_shard, asked))
        claimed: list[ClaimedStep] = []
        for rows in await asyncio.gather(*routed):
            claimed += rows
        for shard in here:
            claimed += await self._take_shard(driver, tolerant, shard, by_shard, asked)
        return claimed

    async def _take_shard(
        self,
        driver: psycopg.AsyncConnection[Any] | None,
        tolerant: _Tolerant,
        shard: int | None,
        by_shard: dict[int, list[Candidate]],
        asked: dict[str, Any],
    ) -> list[ClaimedStep]:
        """One shard's candidates taken in one call (step_claim_shard), on the node that
        holds it, else on ``driver``."""
        group = by_shard[shard]  # type: ignore[index]
        return await tolerant(
            lambda: self._on_shard(
                driver,
                shard,
                "step_claim_shard",
                ClaimedStep,
                run_id=str(group[0].run_id),
                runs=[str(c.run_id) for c in group],
                nodes=[c.node for c in group],
                **asked,
            )
        )

    async def _candidates(
        self,
        worker_id: str,
        actions: list[str],
        limit: int,
        builds: list[str],
        flow: Mapping[str, list[Any]],
        pinned: Pool | None = None,
    ) -> list[Candidate]:
        """The claim's first read, across shards (``limit``: twice the claim's steps):
        on a server that routes, from each node that holds shards (unless a keyed step
        is met); else through the node of the server's URL; shard by shard while a node
        is down. ``pinned``: only the shards of that node, read there."""
        holders = self.pool.shard_holders() if pinned is None else [pinned]
        if holders:
            found = await self._candidates_by_node(holders, worker_id, actions, limit, builds, flow)
            if found is not None:
                return found
        if pinned is None:
            return await self._across(worker_id, actions, limit, builds, flow)
        # A keyed step met: the read across shards (which passes over the keys already
        # full), as many candidates for each node, kept to the pinned node's shards.
        pool = self.pool
        each = limit * max(1, len(pool.shard_holders()))
        found = await self._across(worker_id, actions, each, builds, flow)
        return [c for c in found if (pool.node_of(c.shard) or pool) is pinned][:limit]

    async def _across(
        self,
        worker_id: str,
        actions: list[str],
        limit: int,
        builds: list[str],
        flow: Mapping[str, list[Any]],
    ) -> list[Candidate]:
        """The claim's first read as one query across shards, through the node of the
        server's URL; shard by shard while a node is down."""
        try:
            return await self._all(
                "step_candidates_sharded",
                Candidate,
                worker_id=worker_id,
                actions=actions,
                limit=limit,
                builds=builds,
                **flow,
            )
        except errors.Unavailable:
            # A node is down: the shards on the others, read one by one, go on.
            return await self._candidates_by_shard(actions, limit, builds, flow)

    async def _candidates_by_node(
        self,
        holders: list[Pool],
        worker_id: str,
        actions: list[str],
        limit: int,
        builds: list[str],
        flow: Mapping[str, list[Any]],
    ) -> list[Candidate] | None:
        """step_candidates_sharded's answer made from each node's own shards
        (step_candidates_node, the nodes asked at once), merged in claim order; the
        nodes that do not answer are passed over, and Unavailable is raised when none
        does. None when a step with a concurrency key is met: then the read across
        shards, which passes over the keys already full, is made instead. With several
        nodes each is asked for half of ``limit`` (the claim's steps): the first steps
        in claim order are all there, and so are as many again for steps other servers
        take first, in half the rows."""
        each = limit if len(holders) == 1 else max(1, limit // 2)
        answers = await asyncio.gather(
            *(
                node._all(
                    "step_candidates_node",
                    ShardCandidate,
                    worker_id=worker_id,
                    actions=actions,
                    limit=each,
                    builds=builds,
                    **flow,
                )
                for node in holders
            ),
            return_exceptions=True,
        )
        found: list[ShardCandidate] = []
        failed: errors.Unavailable | None = None
        for answer in answers:
            if isinstance(answer, errors.Unavailable):
                failed = answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                found += answer
        if failed is not None and all(isinstance(a, BaseException) for a in answers):
            raise failed
        if any(c.concurrency_key is not None for c in found):
            return None
        found.sort(key=lambda c: (-c.priority, c.due))
        return [Candidate(*c[:7]) for c in found[:limit]]

    async def _candidates_by_shard(
        self, actions: list[str], limit: int, builds: list[str], flow: Mapping[str, list[Any]]
    ) -> list[Candidate]:
        """step_candidates_sharded's answer made shard by shard (step_candidates_on, each
        call delegated to the shard's node), for the shards whose node answers, merged in
        claim order; Unavailable when none does (a shard that answers with nothing is
        an answer: the claim then finds no work, as it would with every node up)."""
        if not self.pool.shard_runs:
            rows = await self._all("shard_representatives", Representative)
            self.pool.shard_runs = [r.run_id for r in rows]
        found: list[ShardCandidate] = []
        failed: errors.Unavailable | None = None
        answered = 0
        for run_id in self.pool.shard_runs:
            try:
                found += await self._all(
                    "step_candidates_on",
                    ShardCandidate,
                    run_id=run_id,
                    actions=actions,
                    limit=limit,
                    builds=builds,
                    **flow,
                )
                answered += 1
            except errors.Unavailable as exc:
                failed = exc
        if failed is not None and not answered:
            raise failed
        found.sort(key=lambda c: (-c.priority, c.due))
        return [Candidate(*c[:7]) for c in found[:limit]]
