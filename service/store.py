"""The only module that talks SQL.

Queries are the named blocks of ``service/sql/queries.sql``; transitions are the
functions of the migrations. Every call runs as one statement in autocommit mode:
each transition is one function call, so it is one transaction and one round trip.
Each query's rows come back as its named type (service.records). Database errors
are translated here, and only here, into domain errors (service.errors): raised, or
for one item of a CompleteMany batch returned as a typed :class:`Refused`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

import psycopg
import psycopg.pq
import psycopg.types.json
import sqlalchemy as sa
from psycopg.rows import RowMaker
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn
from uuid6 import uuid7

from cyclone import codes
from cyclone.dag import NodeSpec, excerpt
from service import errors
from service.records import (
    ActionSeenRow,
    Attempt,
    BatchRow,
    CallResolved,
    Cancelled,
    Candidate,
    ChildStarted,
    ClaimedStep,
    Completion,
    Continued,
    Deleted,
    DueSchedule,
    EventSent,
    ExplainCounts,
    ExplainFacts,
    Fired,
    GaugeRow,
    Heartbeat,
    Kept,
    LogRow,
    NextDue,
    NoRows,
    Now,
    Outcome,
    OutcomeRow,
    Pending,
    Ready,
    ReadyActions,
    Refused,
    ReportRow,
    Retried,
    RunCountRow,
    RunErrorRow,
    RunRow,
    RunSummary,
    ScheduleName,
    ScheduleRow,
    ScheduleTurn,
    Sharded,
    StepCallBegun,
    StepCallEnded,
    StepListed,
    Submitted,
    Swept,
    Waited,
    WorkerAction,
)

#: A row type of service.records: a NamedTuple of the query's columns, in order.
T = TypeVar("T")
R = TypeVar("R", bound=tuple[Any, ...])

#: Reads with optional filters written "(:x IS NULL OR column = :x)": never prepared, so
#: that each call is planned with its values (the filters not given fold away and the
#: planner picks the index of those given), never with a generic plan that must serve
#: every combination by walking one index past rows it then filters out.
UNPREPARED = frozenset({"runs_list", "runs_count", "steps_list"})

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.M)


def load_queries() -> dict[str, sa.TextClause]:
    """Parse queries.sql into {name: statement}."""
    source = resources.files("service.sql").joinpath("queries.sql").read_text()
    parts = _NAME_LINE.split(source)
    return {
        name: sa.text(body.strip()) for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


Q = load_queries()


def _rows_as(cls: type[R]) -> Callable[[Any], RowMaker[R]]:
    """A psycopg row factory that makes ``cls`` from each row, once it has checked that
    the statement's columns are ``cls``'s fields, in order."""
    fields: tuple[str, ...] = getattr(cls, "_fields")  # noqa: B009
    make: RowMaker[R] = getattr(cls, "_make")  # noqa: B009

    def factory(cursor: Any) -> RowMaker[R]:
        if cursor.description is not None:
            columns = tuple(c.name for c in cursor.description)
            if columns != fields:
                raise TypeError(f"columns {columns} are not the fields of {cls.__name__}")
        return make

    return factory


def _rows_made(cls: type[R]) -> Callable[[Any], RowMaker[R]]:
    """_rows_as without the check, for a statement whose columns it has checked."""
    factory = _UNCHECKED.get(cls)
    if factory is None:
        make: RowMaker[R] = getattr(cls, "_make")  # noqa: B009
        factory = _UNCHECKED[cls] = lambda cursor: make
    return factory


_UNCHECKED: dict[type[Any], Callable[[Any], RowMaker[Any]]] = {}


_IDLE = psycopg.pq.TransactionStatus.IDLE
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_json(data: str | bytes) -> Any:
    """A json or jsonb value read from Postgres: what json.loads gives, through its C
    scanner directly. Postgres writes jsonb as one value with no space around it;
    anything else (a json value with spaces around it) goes through json.loads."""
    text = data if isinstance(data, str) else data.decode()
    try:
        obj, end = _scan_json(text, 0)
    except StopIteration:
        return json.loads(text)  # raises the JSONDecodeError it should
    return obj if end == len(text) else json.loads(text)


def _configure(dbapi_connection: Any, record: Any) -> None:
    """A new pooled connection: JSON results parsed by loads_json (json.loads spends
    more on checking its input than on parsing a small value)."""
    psycopg.types.json.set_json_loads(loads_json, dbapi_connection.driver_connection)


def sql_url(database_url: str) -> str:
    """A libpq URL as SQLAlchemy wants it for psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    return database_url


def submit_key_id(workflow: str, submit_key: str) -> uuid.UUID:
    """The id of a SubmitOnce key and of the run it makes, as cyclone.submit_key_id
    computes it: a name-based UUID (version 8) of SHA-256 over a prefix, the workflow, a
    NUL and the key."""
    digest = hashlib.sha256(
        b"cyclone submit key\0" + workflow.encode() + b"\0" + submit_key.encode()
    ).digest()
    raw = bytearray(digest[:16])
    raw[6] = raw[6] & 0x0F | 0x80
    raw[8] = raw[8] & 0x3F | 0x80
    return uuid.UUID(bytes=bytes(raw))


def parse_uuid(value: str, what: str = "run_id") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise errors.InvalidArgument(f"{what} {excerpt(value)} is not a UUID") from None


CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uuid_text(value: str, what: str = "run_id") -> str:
    """A UUID from a client as canonical text (lower case, hyphenated, as Postgres and
    str(uuid.UUID) write it); INVALID_ARGUMENT when it is not a UUID. The canonical
    text workers send back is taken as it is, without making a uuid.UUID of it."""
    if CANONICAL_UUID.fullmatch(value) is not None:
        return value
    return str(parse_uuid(value, what))


@dataclass(frozen=True, slots=True)
class ActionSeen:
    """What a server saw of the workers serving one action: seconds since a Claim
    last named it and by whom, and since one last got a step of it (None: not since)."""

    action: str
    polled_ago: float
    polled_by: str
    claimed_ago: float | None = None
    claimed_by: str | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """step_report_many's answers, one per item of each kind, in request order."""

    ends: list[StepCallEnded | Refused]
    begins: list[StepCallBegun | Refused]
    completions: list[Completion | Refused]


@dataclass(frozen=True, slots=True)
class StepCallEnd:
    """The end of one step call: its key and exactly one of output or error (JSON)."""

    key: StepCallKey
    output_json: str | None
    error_json: str | None


@dataclass(frozen=True, slots=True)
class StepCallKey:
    """One step call of a held step, as BeginStepCall and EndStepCall name it (ids as
    canonical text, service.store.uuid_text)."""

    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    function: str
    unsafe: bool

    def params(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "node": self.node,
            "lease_token": self.lease_token,
            "step_id": self.step_id,
            "seq": self.seq,
            "function": self.function,
            "unsafe": self.unsafe,
        }


def _as_param(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


@dataclass(frozen=True, slots=True)
class WaitKey:
    """One wait of a held step, as Wait names it: a sleep (wake_at), an event (event,
    timeout_s: None for no limit) or a child run (child)."""

    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    function: str
    wake_at: datetime | None = None
    event: str | None = None
    timeout_s: float | None = None
    child: uuid.UUID | None = None

    def params(self) -> dict[str, Any]:
        """The named query's parameters: every field, ids as text."""
        return {name: _as_param(getattr(self, name)) for name in self.__slots__}


#: Nodes plus edges past which a workflow is validated and encoded in a worker thread
#: rather than on the event loop, so that other calls keep being answered meanwhile.
BIG_WORKFLOW = 2000


def nodes_json(nodes: Sequence[NodeSpec]) -> str:
    """The nodes of a validated workflow as run_submit's JSON argument; linear time.
    Encoded node by node: one call of the C encoder over megabytes would hold the GIL,
    and so the event loop, for all of its duration."""
    return (
        "["
        + ",".join(
            json.dumps(
                {
                    "name": n.name,
                    "action": n.action,
                    "depends_on": n.depends_on,
                    "trigger_rule": n.trigger_rule,
                    "max_attempts": n.max_attempts,
                    "initial_backoff_s": n.initial_backoff_s,
                    "max_backoff_s": n.max_backoff_s,
                    "backoff_multiplier": n.backoff_multiplier,
                    "timeout_s": n.timeout_s,
                    "input": n.input,
                    "dependents": n.dependents,
                    "priority": n.priority,
                    "concurrency_key": n.concurrency_key,
                    "concurrency_limit": n.concurrency_limit,
                    "position": i,
                },
                separators=(",", ":"),
            )
            for i, n in enumerate(nodes)
        )
        + "]"
    )


async def _encoded(nodes: Sequence[NodeSpec]) -> str:
    """nodes_json, off the event loop for a large workflow."""
    if len(nodes) + sum(len(n.depends_on) for n in nodes) > BIG_WORKFLOW:
        # Encoding a large workflow takes a while: not on the event loop.
        return await asyncio.to_thread(nodes_json, nodes)
    return nodes_json(nodes)


class Store:
    """Database access for the server: one method per named query."""

    def __init__(
        self,
        database_url: str,
        *,
        pool_size: int = 10,
        statement_timeout_ms: int = 0,
        on_ready: Callable[[set[str]], None] | None = None,
        on_acquire: Callable[[float], None] | None = None,
    ):
        # Transitions report the actions they made ready instead of notifying inside
        # their transaction (_notify_ready, service/schema/10_internals.sql); on_ready
        # hears of them.
        self.on_ready = on_ready
        # Hears how long each statement waited for a pooled connection (a metric).
        self.on_acquire = on_acquire
        # Whether the database is sharded (Citus); asked once, on the first claim.
        self.sharded: bool | None = None
        options = "-c application_name=cyclone-server -c cyclone.defer_notify=on"
        # On Citus: a multi-shard statement uses one connection per worker node (the
        # cached one) instead of opening more, in parallel, and closing them after the
        # transaction; opening them cost the worker nodes more than the claim itself
        # (docs/scaling.md). A setting without effect on a database without Citus.
        options += " -c citus.max_adaptive_executor_pool_size=1"
        if statement_timeout_ms:
            options += f" -c statement_timeout={int(statement_timeout_ms)}"
        self._compiled: dict[str, str] = {}
        # (query, row type) pairs whose columns _run has checked.
        self._checked: set[tuple[str, type[Any]]] = set()
        self.engine: AsyncEngine = create_async_engine(
            sql_url(database_url),
            pool_size=pool_size,
            # Overflow connections would be opened and closed under load; wait instead.
            max_overflow=0,
            # The most recently used connection first: under light load a few warm
            # connections (plans and compiled functions cached) serve everything.
            pool_use_lifo=True,
            pool_pre_ping=False,
            # _connection returns only idle connections to the pool: nothing to reset.
            pool_reset_on_return=None,
            isolation_level="AUTOCOMMIT",
            connect_args={"options": options},
        )
        sa.event.listen(self.engine.sync_engine, "connect", _configure)
        self._pool = self.engine.sync_engine.pool

    async def close(self) -> None:
        await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection's psycopg connection, database errors translated."""
        # SQLAlchemy keeps the pool and compiles the named query once; the statement
        # itself runs on the psycopg connection underneath. Its execution layer cost
        # more CPU than the hot transitions themselves, and so did engine.connect()'s
        # wrappers around a check-out (docs/performance.md): the pool is used directly.
        try:
            asked = time.perf_counter()
            pooled = await greenlet_spawn(self._pool.connect)
            if self.on_acquire is not None:
                self.on_acquire(time.perf_counter() - asked)
            driver: psycopg.AsyncConnection[Any] = pooled.driver_connection  # type: ignore[assignment]
            keep = False
            try:
                yield driver
                keep = True
            except psycopg.Error:
                keep = True
                raise
            finally:
                # A broken connection, one left mid-statement by a cancellation or in
                # a transaction, must not go back to the pool. The check-in never
                # suspends (no reset on return), so a cancellation cannot cut it short.
                if (
                    keep
                    and not driver.closed
                    and not driver.broken
                    and driver.pgconn.transaction_status == _IDLE
                ):
                    pooled.close()
                else:
                    # Closed here (close() never suspends), then dropped from the pool
                    # (invalidate() checks its entry in, to be connected anew).
                    await driver.close()
                    await greenlet_spawn(pooled.invalidate)
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        except sa.exc.DBAPIError as exc:  # raised while connecting
            raise _translate(exc.orig or exc) from exc
        except OSError as exc:
            raise errors.Unavailable(detail=f"database unavailable: {exc}") from exc

    async def _run(
        self, driver: psycopg.AsyncConnection[Any], name: str, row: type[R], **params: Any
    ) -> list[R]:
        # A statement's columns are checked against its row type once per process: the
        # check reads cursor.description, which makes an object per column every time.
        checked = (name, row) in self._checked
        cursor = driver.cursor(row_factory=_rows_made(row) if checked else _rows_as(row))
        await cursor.execute(self._sql(name), params, prepare=False if name in UNPREPARED else None)
        result = cursor.pgresult
        if result is None or result.status != psycopg.pq.ExecStatus.TUPLES_OK:
            return []
        if not checked:
            self._checked.add((name, row))
        return await cursor.fetchall()

    async def _all(self, name: str, row: type[R], **params: Any) -> list[R]:
        async with self._connection() as driver:
            rows = await self._run(driver, name, row, **params)
        if rows and self.on_ready and "ready" in getattr(row, "_fields"):  # noqa: B009
            self._published(r.ready for r in rows)  # type: ignore[attr-defined]
        return rows

    async def _logged(self, name: str, row: type[R], logs: str | None, **params: Any) -> list[R]:
        """_all, after storing log lines (step_logs_add's items, JSON) in the same
        transaction; just _all when there are none."""
        if logs is None:
            return await self._all(name, row, **params)
        async with self._connection() as driver, driver.transaction():
            await self._run(driver, "step_logs_add", Kept, items=logs)
            rows = await self._run(driver, name, row, **params)
        if rows and self.on_ready and "ready" in getattr(row, "_fields"):  # noqa: B009
            self._published(r.ready for r in rows)  # type: ignore[attr-defined]
        return rows

    def _published(self, ready: Iterable[str | None]) -> None:
        """Tell on_ready of the actions that transitions made claimable."""
        actions = {a for r in ready if r for a in r.split(",")}
        if actions and self.on_ready:
            self.on_ready(actions)

    def _sql(self, name: str) -> str:
        sql = self._compiled.get(name)
        if sql is None:
            sql = self._compiled[name] = str(Q[name].compile(dialect=self.engine.dialect))
        return sql

    async def _one(self, name: str, row: type[R], **params: Any) -> R | None:
        rows = await self._all(name, row, **params)
        return rows[0] if rows else None

    # Runs -------------------------------------------------------------------------

    async def run_submit(
        self,
        *,
        workflow: str,
        nodes: Sequence[NodeSpec],
        input_json: str | None,
        submit_key: str | None,
        start_at: datetime | None = None,
        priority: int = 0,
    ) -> tuple[uuid.UUID, bool]:
        from uuid6 import uuid7

        encoded = await _encoded(nodes)
        row = await self._one(
            "run_submit",
            Submitted,
            # A keyed run's id is its key's: run_submit would take it anyway, and on
            # Citus the call is routed by it.
            run_id=str(uuid7() if submit_key is None else submit_key_id(workflow, submit_key)),
            workflow=workflow,
            submit_key=submit_key,
            input=input_json,
            nodes=encoded,
            start_at=start_at,
            priority=priority,
        )
        assert row is not None
        return row.run_id, row.created

    async def run_get(self, run_id: uuid.UUID, node: str | None = None) -> RunRow:
        """The run with its steps (only ``node``'s when given), errors and audit trail."""
        row = await self._one("run_get", RunRow, run_id=str(run_id), node=node)
        if row is None:
            raise errors.NotFound(f"run {run_id} not found")
        return row

    async def runs_list(
        self,
        *,
        workflow: str | None,
        statuses: list[str] | None,
        created_after: datetime | None,
        created_before: datetime | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        key: str | None = None,
    ) -> list[RunSummary]:
        return await self._all(
            "runs_list",
            RunSummary,
            workflow=workflow,
            statuses=statuses,
            created_after=created_after,
            created_before=created_before,
            key=key,
            after_created=after[0] if after else None,
            after_run_id=str(after[1]) if after else None,
            limit=limit,
        )

    async def runs_count(
        self,
        *,
        workflow: str | None,
        statuses: list[str],
        created_after: datetime | None,
        created_before: datetime | None,
        key: str | None,
        limit: int,
    ) -> dict[str, int]:
        """Runs per status in ``statuses``, each counted up to ``limit``."""
        rows = await self._all(
            "runs_count",
            RunCountRow,
            workflow=workflow,
            statuses=statuses,
            created_after=created_after,
            created_before=created_before,
            key=key,
            limit=limit,
        )
        return {r.status: r.n for r in rows}

    async def steps_list(
        self,
        *,
        kind: str,
        lease_expired: bool,
        worker_id: str | None,
        action: str | None,
        after: tuple[datetime, uuid.UUID, str] | None,
        limit: int,
    ) -> list[StepListed]:
        return await self._all(
            "steps_list",
            StepListed,
            kind=kind,
            lease_expired=lease_expired,
            worker_id=worker_id,
            action=action,
            after_at=after[0] if after else None,
            after_run_id=str(after[1]) if after else None,
            after_node=after[2] if after else None,
            limit=limit,
        )

    async def workers_list(self) -> tuple[list[WorkerAction], list[ActionSeenRow]]:
        """The running steps by worker and action, and every action's activity."""
        running = await self._all("workers_running", WorkerAction)
        return running, await self._all("actions_activity", ActionSeenRow)

    async def run_cancel(
        self, run_id: uuid.UUID, *, actor: str, reason: str, keep_children: bool = False
    ) -> None:
        await self._all(
            "run_cancel",
            Cancelled,
            run_id=str(run_id),
            actor=actor,
            reason=reason,
            keep_children=keep_children,
        )

    async def child_start(
        self,
        parent: StepCallKey,
        *,
        workflow: str,
        nodes: Sequence[NodeSpec],
        input_json: str | None,
    ) -> ChildStarted:
        """StartChild: submit the child run of one step call of a held step, or find the
        one it started before."""
        from uuid6 import uuid7

        encoded = await _encoded(nodes)
        key = parent.params()
        del key["function"], key["unsafe"]
        row = await self._one(
            "child_start",
            ChildStarted,
            **key,
            child_run_id=str(uuid7()),
            workflow=workflow,
            input=input_json,
            nodes=encoded,
        )
        assert row is not None
        return row

    # Steps ------------------------------------------------------------------------

    async def step_claim(
        self,
        *,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease_s: float,
        rates: Mapping[str, tuple[int, float]] | None = None,
    ) -> list[ClaimedStep]:
        """rates: the actions the worker declares rate limited, with (count, period_s)."""
        rated = list((rates or {}).items())
        flow: dict[str, list[Any]] = {
            "rate_actions": [a for a, _ in rated],
            "rate_counts": [c for _, (c, _) in rated],
            "rate_periods": [p for _, (_, p) in rated],
        }
        if await self.is_sharded():
            return await self._claim_sharded(worker_id, actions, unsafe, limit, lease_s, flow)
        return await self._all(
            "step_claim",
            ClaimedStep,
            worker_id=worker_id,
            actions=actions,
            unsafe=unsafe,
            limit=limit,
            lease_s=lease_s,
            **flow,
        )

    async def is_sharded(self) -> bool:
        """Whether the run-level tables are distributed (Citus, docs/scaling.md): then
        claims, retention and key retention go run by run (95_shards.sql)."""
        if self.sharded is None:
            row = await self._one("sharded", Sharded)
            self.sharded = bool(row and row.sharded)
        return self.sharded

    async def _claim_sharded(
        self,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease_s: float,
        flow: dict[str, list[Any]],
    ) -> list[ClaimedStep]:
        """A claim on a sharded database (95_shards.sql): one multi-shard read of the
        ready steps (no locks), then each shard's taken in one delegated call, a
        single-shard transaction (step_claim_shard), and those under flow control
        admitted under their locks on the coordinator (step_claim_flow). Twice the steps
        asked are read, as other servers may take some first."""
        found = await self._all(
            "step_candidates_sharded", Candidate, actions=actions, limit=limit * 2, **flow
        )
        claimed: list[ClaimedStep] = []
        async with self._connection() as driver:
            # The first candidates in claim order, each shard's in one call; the next
            # ones, in the same way, while other servers took some of these first.
            pending = [c for c in found if not c.flow]
            while pending:
                left = limit - sum(not r.blocked for r in claimed)
                if left <= 0:
                    break
                by_shard: dict[int, list[Candidate]] = {}
                for c in pending[:left]:
                    by_shard.setdefault(c.shard, []).append(c)
                pending = pending[left:]
                for group in by_shard.values():
                    claimed += await self._run(
                        driver,
                        "step_claim_shard",
                        ClaimedStep,
                        run_id=str(group[0].run_id),
                        runs=[str(c.run_id) for c in group],
                        nodes=[c.node for c in group],
                        worker_id=worker_id,
                        unsafe=unsafe,
                        lease_s=lease_s,
                    )
            held = [c for c in found if c.flow]
            left = limit - sum(not r.blocked for r in claimed)
            if held and left > 0:
                claimed += await self._run(
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
                    **flow,
                )
        return claimed

    async def steps_release(self, claimed: Sequence[ClaimedStep]) -> int:
        """Hand back claimed steps that never reached their worker."""
        rows = await self._all(
            "steps_release",
            Ready,
            run_ids=[r.run_id for r in claimed],
            nodes=[r.node for r in claimed],
            tokens=[r.lease_token for r in claimed],
            uncertain=[r.effect_uncertain for r in claimed],
        )
        return len(rows)

    async def step_logs(
        self, run_id: uuid.UUID, node: str | None = None, attempt: int | None = None
    ) -> list[LogRow]:
        """A run's log lines (one node's, one attempt's), by node, attempt and order."""
        return await self._all(
            "step_logs_get", LogRow, run_id=str(run_id), node=node, attempt=attempt
        )

    async def runs_errors(self, run_ids: Sequence[str]) -> dict[str, Any]:
        """The errors of these runs (those a claim blocked), by run (ids as text)."""
        rows = await self._all("runs_errors", RunErrorRow, run_ids=list(run_ids))
        return {str(row.run_id): row.error for row in rows}

    async def step_next_due(self, actions: list[str]) -> float | None:
        name = "step_next_due_sharded" if await self.is_sharded() else "step_next_due"
        row = await self._one(name, NextDue, actions=actions)
        return None if row is None or row.seconds is None else float(row.seconds)

    async def step_attempt(self, run_id: str, node: str) -> int | None:
        row = await self._one("step_attempt", Attempt, run_id=run_id, node=node)
        return None if row is None else int(row.attempt)

    async def step_heartbeat(
        self,
        run_id: str,
        node: str,
        lease_token: str,
        *,
        lease_s: float,
        progress_json: str | None,
        logs_json: str | None = None,
    ) -> Heartbeat:
        """``logs_json``: the handler's log lines (a JSON array), stored with it."""
        logs = None
        if logs_json is not None:
            logs = _logs_items([Outcome(run_id, node, lease_token, logs_json=logs_json)])
        [row] = await self._logged(
            "step_heartbeat",
            Heartbeat,
            logs,
            run_id=run_id,
            node=node,
            lease_token=lease_token,
            lease_s=lease_s,
            progress=progress_json,
        )
        return row

    async def step_complete(self, outcome: Outcome) -> Completion:
        """Apply one outcome: an output, or a failure (step_fail; step_abandon when an
        unsafe handler stopped without an outcome)."""
        key = {"run_id": outcome.run_id, "node": outcome.node, "lease_token": outcome.lease_token}
        failure = outcome.failure
        logs = _logs_items([outcome])
        if failure is None:
            [row] = await self._logged(
                "step_complete", OutcomeRow, logs, **key, output=outcome.output_json
            )
        elif failure.uncertain:
            [row] = await self._logged(
                "step_abandon",
                OutcomeRow,
                logs,
                **key,
                type=failure.type,
                message=failure.message,
                details=failure.details,
            )
        else:
            [row] = await self._logged(
                "step_fail",
                OutcomeRow,
                logs,
                **key,
                type=failure.type,
                message=failure.message,
                details=failure.details,
                retryable=failure.retryable,
                retry_after_s=failure.retry_after_s,
            )
        return Completion(row.step_status, row.run_status, row.duplicate, row.retry_at)

    async def step_complete_many(self, outcomes: Sequence[Outcome]) -> list[Completion | Refused]:
        """Apply several outcomes in one transaction; one answer per outcome, in order.
        An outcome the engine refused (a lost lease, an unknown step) is a Refused that
        changed nothing, and does not affect the others. On a sharded database each
        outcome is its own transaction on its run's shard (docs/scaling.md)."""
        if await self.is_sharded():
            return [await _alone(self.step_complete(o)) for o in outcomes]
        rows = await self._logged(
            "step_complete_many", BatchRow, _logs_items(outcomes), items=outcomes_json(outcomes)
        )
        return [_batch_answer(row) for row in sorted(rows, key=lambda r: r.i)]

    async def step_report_many(
        self,
        ends: Sequence[StepCallEnd],
        begins: Sequence[StepCallKey],
        outcomes: Sequence[Outcome],
        *,
        brief: bool = False,
    ) -> Report:
        """End step calls, begin others, then apply outcomes, in one transaction: one
        answer per item, in order, each refusal standing alone as in
        step_complete_many. Ends of safe step calls alone are committed without waiting
        for the WAL flush. ``brief``: the entries of ends and of RUN answers may be
        left out (None). On a sharded database each item is its own single-shard
        transaction, in the same order (docs/scaling.md)."""
        if await self.is_sharded():
            return await self._report_alone(ends, begins, outcomes)
        end_items = []
        for i, end in enumerate(ends):
            item: dict[str, Any] = {"i": i, **end.key.params()}
            if end.error_json is not None:
                item["error"] = _RawJson(end.error_json)
            else:
                item["output"] = _RawJson(end.output_json or "null")
            end_items.append(item)
        rows = await self._logged(
            "step_report_many",
            ReportRow,
            _logs_items(outcomes),
            ends=_dump_items(end_items),
            begins=_dump_items([{"i": i, **key.params()} for i, key in enumerate(begins)]),
            items=outcomes_json(outcomes),
            durable=bool(outcomes or begins) or any(end.key.unsafe for end in ends),
            brief=brief,
        )
        answers: dict[tuple[str, int], Any] = {}
        for row in rows:
            if row.error_state is not None:
                answers[row.kind, row.i] = Refused(
                    _domain_error(row.error_state, row.error_message or "", row.error_detail)
                )
            elif row.kind == "end":
                assert (brief or row.call is not None) and row.duplicate is not None
                answers[row.kind, row.i] = StepCallEnded(row.duplicate, row.call)
            elif row.kind == "begin":
                assert row.decision is not None and row.run_status is not None
                answers[row.kind, row.i] = StepCallBegun(row.decision, row.run_status, row.call)
            else:
                assert row.step_status is not None and row.run_status is not None
                answers[row.kind, row.i] = Completion(
                    row.step_status, row.run_status, bool(row.duplicate), row.retry_at
                )
        # A missing answer is a KeyError: a bug, answered INTERNAL.
        return Report(
            ends=[answers["end", i] for i in range(len(ends))],
            begins=[answers["begin", i] for i in range(len(begins))],
            completions=[answers["step", i] for i in range(len(outcomes))],
        )

    async def _report_alone(
        self,
        ends: Sequence[StepCallEnd],
        begins: Sequence[StepCallKey],
        outcomes: Sequence[Outcome],
    ) -> Report:
        """step_report_many item by item (Citus: a transaction may lock one shard)."""
        ended = [
            await _alone(
                self.step_call_end(e.key, output_json=e.output_json, error_json=e.error_json)
            )
            for e in ends
        ]
        begun = [await _alone(self.step_call_begin(key)) for key in begins]
        done = [await _alone(self.step_complete(o)) for o in outcomes]
        return Report(ends=ended, begins=begun, completions=done)

    async def step_call_begin(self, call: StepCallKey) -> StepCallBegun:
        """BeginStepCall: what the caller must do with one step call of a held step."""
        row = await self._one("step_call_begin", StepCallBegun, **call.params())
        assert row is not None
        return row

    async def step_call_end(
        self, call: StepCallKey, *, output_json: str | None, error_json: str | None
    ) -> StepCallEnded:
        """EndStepCall: record one step call's outcome (exactly one of the two)."""
        row = await self._one(
            "step_call_end", StepCallEnded, **call.params(), output=output_json, error=error_json
        )
        assert row is not None
        return row

    async def step_wait(self, wait: WaitKey) -> Waited:
        """Wait: a durable function waits (step_wait, service/schema/47_waits.sql; for a
        child run through child_wait, 48_children.sql, which locks the child first)."""
        name = "step_wait" if wait.child is None else "child_wait"
        row = await self._one(name, Waited, **wait.params())
        assert row is not None
        return row

    async def event_send(
        self,
        run_id: uuid.UUID,
        name: str,
        *,
        payload_json: str | None,
        key: str | None,
        actor: str,
    ) -> EventSent:
        """SendEvent: keep an event for the run's waits and wake its waiting nodes."""
        row = await self._one(
            "event_send",
            EventSent,
            run_id=str(run_id),
            event_name=name,
            payload=payload_json,
            key=key,
            actor=actor,
        )
        assert row is not None
        return row

    async def step_call_resolve(
        self,
        run_id: uuid.UUID,
        node: str | None,
        step_id: str,
        *,
        choice: str,
        value_json: str | None,
        actor: str,
        reason: str,
    ) -> str:
        """Resolve a run blocked on a step call; returns the node (``node`` None: the
        one the run's error names)."""
        row = await self._one(
            "step_call_resolve",
            CallResolved,
            run_id=str(run_id),
            node=node,
            step_id=step_id,
            choice=choice,
            value=value_json,
            actor=actor,
            reason=reason,
        )
        assert row is not None
        return row.node

    async def step_retry(
        self, run_id: uuid.UUID, nodes: list[str] | None, *, actor: str, reason: str
    ) -> list[str]:
        row = await self._one(
            "step_retry", Retried, run_id=str(run_id), nodes=nodes, actor=actor, reason=reason
        )
        assert row is not None
        return list(row.nodes)

    async def step_resolve(
        self,
        run_id: uuid.UUID,
        node: str,
        *,
        choice: str,
        value_json: str | None,
        actor: str,
        reason: str,
    ) -> None:
        await self._all(
            "step_resolve",
            Ready,
            run_id=str(run_id),
            node=node,
            choice=choice,
            value=value_json,
            actor=actor,
            reason=reason,
        )

    async def releases_pending(self, limit: int = 100) -> list[uuid.UUID]:
        """The runs with a release in progress, oldest first."""
        return [r.run_id for r in await self._all("releases_pending", Pending, limit=limit)]

    async def release_continue(self, run_id: uuid.UUID) -> bool:
        """Count the next chunk of a run's release in progress, in a transaction of its
        own; whether any is left."""
        row = await self._one("release_continue", Continued, run_id=str(run_id))
        return bool(row and row.more)

    async def sweep(self, limit: int = 1000) -> list[Swept]:
        """Reclaim expired leases; one row per step."""
        return await self._all("sweep", Swept, limit=limit)

    async def step_explain(self, run_id: uuid.UUID, node: str) -> ExplainFacts:
        """What Explain needs about one step; NotFound for an unknown run or node."""
        row = await self._one("step_explain", ExplainFacts, run_id=str(run_id), node=node)
        if row is None:
            raise errors.NotFound(f"run {run_id} not found")
        if row.node is None:
            raise errors.NotFound(f"run {run_id} has no node {node!r}")
        counts = await self._one(
            "step_explain_counts", ExplainCounts, run_id=str(run_id), node=node
        )
        return row if counts is None else row._replace(**counts._asdict())

    async def action_claims_note(self, seen: Sequence[ActionSeen]) -> None:
        """Record what this server saw of the workers serving each action."""
        if not seen:
            return
        await self._all(
            "action_claims_note",
            NoRows,
            actions=[a.action for a in seen],
            polled_ago=[a.polled_ago for a in seen],
            polled_by=[a.polled_by for a in seen],
            claimed_ago=[a.claimed_ago for a in seen],
            claimed_by=[a.claimed_by for a in seen],
        )

    async def submit_keys_purge(self, *, age_s: float, limit: int) -> int:
        """Forget up to ``limit`` SubmitOnce keys older than ``age_s`` whose run is gone."""
        name = "submit_keys_purge_sharded" if await self.is_sharded() else "submit_keys_purge"
        row = await self._one(name, Deleted, age_s=age_s, limit=limit)
        assert row is not None
        return int(row.deleted)

    async def runs_purge(self, *, age_s: float, failed: bool, limit: int) -> int:
        """Delete up to ``limit`` runs finished more than ``age_s`` ago (runs_purge,
        service/schema/80_retention.sql)."""
        name = "runs_purge_sharded" if await self.is_sharded() else "runs_purge"
        row = await self._one(name, Deleted, age_s=age_s, failed=failed, limit=limit)
        return int(row.deleted) if row else 0

    # Schedules --------------------------------------------------------------------

    async def clock_now(self) -> datetime:
        """The engine's time (cyclone.now(): the tests' clock moves it)."""
        row = await self._one("clock_now", Now)
        assert row is not None
        return row.now

    async def schedule_create(self, **values: Any) -> ScheduleRow:
        """Insert a schedule (the columns of schedule_create); AlreadyExists when one has
        the name."""
        row = await self._one("schedule_create", ScheduleRow, **values)
        if row is None:
            raise errors.AlreadyExists(f"schedule {values['schedule']!r} exists")
        return row

    async def schedule_get(self, name: str) -> ScheduleRow:
        return _schedule_found(name, await self._one("schedule_get", ScheduleRow, schedule=name))

    async def schedules_list(self, *, after: str | None, limit: int) -> list[ScheduleRow]:
        return await self._all("schedules_list", ScheduleRow, after=after, limit=limit)

    async def schedule_pause(self, name: str) -> ScheduleRow:
        return _schedule_found(name, await self._one("schedule_pause", ScheduleRow, schedule=name))

    async def schedule_resume(self, name: str, next_fire_at: datetime) -> ScheduleRow:
        row = await self._one(
            "schedule_resume", ScheduleRow, schedule=name, next_fire_at=next_fire_at
        )
        return _schedule_found(name, row)

    async def schedule_delete(self, name: str) -> None:
        _schedule_found(name, await self._one("schedule_delete", ScheduleName, schedule=name))

    async def schedules_fire(
        self,
        plan: Callable[[DueSchedule], FirePlan],
        limit: int,
        keyed: Callable[[DueSchedule], Awaitable[Sequence[NodeSpec]]],
    ) -> Fires:
        """One firing pass, in one transaction: lock up to ``limit`` due schedules
        (skipping those another server holds), fire each as ``plan`` says, move each
        forward, commit. A server that dies before the commit fires nothing: the
        schedules stay due for the next pass of any server. Each schedule is fired
        under a savepoint: one that fails (its plan, its keys, or its submit) is left
        due, with its error in ``failed``, and the others fire. A schedule whose nodes
        still hold key templates first gets the nodes ``keyed`` gives in their place."""
        fires = Fires(due=0, fired=[], missed={}, more=False, failed={})
        sharded = await self.is_sharded()
        async with self._connection() as driver, driver.transaction():
            if sharded:
                [turn] = await self._run(driver, "schedules_turn", ScheduleTurn)
                if not turn.turn:
                    return fires  # another server is firing: passed by, not waited for
            due = await self._run(driver, "schedules_due", DueSchedule, limit=limit)
            fires.due = len(due)
            for schedule in due:
                try:
                    fire = plan(schedule)
                    nodes = None if schedule.nodes_keyed else await _encoded(await keyed(schedule))
                    async with driver.transaction():
                        if nodes is not None:
                            await self._run(
                                driver,
                                "schedule_nodes_keyed",
                                NoRows,
                                schedule=schedule.name,
                                nodes=nodes,
                            )
                        rows = await self._run(
                            driver,
                            "schedule_fire",
                            Fired,
                            schedule=schedule.name,
                            fire_times=fire.fire_times,
                            run_ids=[str(uuid7()) for _ in fire.fire_times],
                            next_fire_at=fire.next_fire_at,
                        )
                except psycopg.Error as exc:
                    if driver.broken or driver.closed:
                        raise
                    fires.failed[schedule.name] = str(_translate(exc))
                    continue
                except Exception as exc:  # the plan (a fire time the cron library cannot
                    # give), or keys that cannot be evaluated for the schedule's input
                    fires.failed[schedule.name] = f"{type(exc).__name__}: {exc}"
                    continue
                if fire.missed:
                    fires.missed[schedule.name] = fire.missed
                fires.more |= fire.next_fire_at <= schedule.now
                fires.fired.extend((schedule.name, row) for row in rows)
            ready = await self._run(driver, "ready_actions", ReadyActions)
        self._published(r.ready for r in ready)
        return fires

    async def metrics_gauges(self) -> list[GaugeRow]:
        return await self._all("metrics_gauges", GaugeRow)

    def pool_status(self) -> tuple[int, int]:
        """(connections in use, connections open) of this server's pool."""
        pool = self.engine.pool
        return pool.checkedout(), pool.checkedout() + pool.checkedin()  # type: ignore[attr-defined]

    async def clock_advance(self, seconds: float) -> None:
        await self._all("clock_advance", NoRows, seconds=seconds)


def _schedule_found(name: str, row: R | None) -> R:
    if row is None:
        raise errors.NotFound(f"schedule {name!r} not found")
    return row


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What one pass does with a due schedule: the fire times to submit (ascending),
    how many it skips as missed, and its next fire time after them."""

    fire_times: list[datetime]
    missed: int
    next_fire_at: datetime


@dataclass(slots=True)
class Fires:
    """What one firing pass did: how many schedules were due, each firing (with its
    schedule's name), the firings skipped as missed, by schedule, whether a schedule
    is left due (it had more firings than one pass submits), and the schedules that
    failed to fire, with the error (left due, tried again at the next pass)."""

    due: int
    fired: list[tuple[str, Fired]]
    missed: dict[str, int]
    more: bool
    failed: dict[str, str]


class _RawJson(str):
    """JSON text to embed as is when dumping a batch."""


def outcomes_json(outcomes: Sequence[Outcome]) -> str:
    """step_complete_many's items, a JSON array of {i, run_id, node, lease_token,
    output | failure}. An outcome's ids are canonical UUID text and its node a checked
    name (service.records.Outcome): they are written as they are, and its output is
    JSON text already, so only a failure goes through the JSON encoder."""
    items = []
    for i, o in enumerate(outcomes):
        head = f'{{"i":{i},"run_id":"{o.run_id}","node":"{o.node}","lease_token":"{o.lease_token}"'
        if o.failure is None:
            items.append(f'{head},"output":{o.output_json or "null"}}}')
        else:
            failure = json.dumps(asdict(o.failure), separators=(",", ":"))
            items.append(f'{head},"failure":{failure}}}')
    return "[" + ",".join(items) + "]"


def _logs_items(outcomes: Sequence[Outcome]) -> str | None:
    """step_logs_add's items for the outcomes that carry log lines; None when none does."""
    items = [
        {
            "run_id": o.run_id,
            "node": o.node,
            "lease_token": o.lease_token,
            "lines": _RawJson(o.logs_json),
        }
        for o in outcomes
        if o.logs_json is not None
    ]
    return _dump_items(items) if items else None


def _dump_items(items: list[dict[str, Any]]) -> str:
    # Outputs and errors already JSON text (_RawJson) are spliced in rather than
    # parsed and dumped again.
    parts = []
    for item in items:
        raws = {k: item.pop(k) for k in [k for k, v in item.items() if isinstance(v, _RawJson)]}
        text = json.dumps(item, separators=(",", ":"))
        for key, raw in raws.items():
            text = f'{text[:-1]},"{key}":{raw}}}'
        parts.append(text)
    return "[" + ",".join(parts) + "]"


async def _alone(call: Awaitable[T]) -> T | Refused:
    """One item of a batch applied on its own (a sharded database): its refusal is its
    answer, as in a batch; an unavailable database still fails the call."""
    try:
        return await call
    except errors.Unavailable:
        raise
    except errors.CycloneError as exc:
        return Refused(exc)


def _batch_answer(row: BatchRow) -> Completion | Refused:
    if row.error_state is not None:
        return Refused(_domain_error(row.error_state, row.error_message or "", row.error_detail))
    assert row.step_status is not None and row.run_status is not None
    return Completion(row.step_status, row.run_status, bool(row.duplicate), row.retry_at)


def _domain_error(sqlstate: str, message: str, detail: str | None) -> errors.CycloneError:
    """The domain error of an SQLSTATE the engine raised, with its message."""
    kind = codes.SQLSTATE_KINDS.get(sqlstate)
    if kind is codes.ErrorKind.LEASE_LOST:
        return errors.LeaseLost(message, current_attempt=codes.current_attempt(detail))
    return errors.of_kind(kind, message)


def _translate(orig: BaseException) -> Exception:
    sqlstate = getattr(orig, "sqlstate", None)
    diag = getattr(orig, "diag", None)
    message = (diag.message_primary if diag else None) or str(orig)
    kind = codes.SQLSTATE_KINDS.get(sqlstate or "")
    if kind is None:
        if sqlstate is None or sqlstate.startswith("08"):
            return errors.Unavailable(detail=f"database unavailable: {message}")
        # Unexpected: becomes INTERNAL with an error id; the details stay in the log.
        return RuntimeError(f"database error {sqlstate}: {message}")
    if kind is codes.ErrorKind.UNAVAILABLE and sqlstate != "57014":
        # A lost connection, a shutdown: the text may name the database's host.
        return errors.Unavailable(detail=f"database unavailable: {message}")
    assert sqlstate is not None
    return _domain_error(sqlstate, message, diag.message_detail if diag else None)
