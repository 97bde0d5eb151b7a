"""The db wing's base: the connection pool, the named queries, and the translation
of database errors into domain errors (service.errors).

Queries are the named blocks of the .sql files beside the modules of service/db/ (one
file per table family, as service/schema/ is laid out); transitions are the functions
of the migrations. Every call runs as one statement in autocommit mode: each
transition is one function call, so it is one transaction and one round trip. Each
query's rows come back as its named type. Database errors are translated here, and
only here: raised, or for one item of a batch returned as a typed Refused.
Transitions also return ``ready``: the actions they made claimable (_notify_ready in
service/schema/10_internals.sql), read in the same statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from importlib import resources
from typing import Any, TypeVar

import psycopg
import psycopg.pq
import psycopg.types.json
import sqlalchemy as sa
from psycopg.rows import RowMaker
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from cyclone import codes
from service import errors
from service.db.records import Kept, Placement, Sharded
from service.db.shard_hash import ShardRanges

log = logging.getLogger("cyclone")

#: On a Citus cluster that the server routes on: how old its map of the shards'
#: nodes may grow before it is read again (a stale map costs a hop, never a wrong
#: answer: any node runs a call for any shard).
ROUTES_REFRESH_S = 60.0

#: A row type: a NamedTuple of the query's columns, in order.
R = TypeVar("R", bound=tuple[Any, ...])

#: The files of named queries, one per table family (service/db/<family>.sql).
FAMILIES = (
    "runs",
    "claim",
    "shards",
    "completion",
    "shard_reports",
    "waits",
    "operator",
    "retention",
    "workers",
    "schedules",
    "builds",
    "bulk",
    "streams",
    "callbacks",
    "queries",
)

#: Reads with optional filters written "(:x IS NULL OR column = :x)": never prepared, so
#: that each call is planned with its values (the filters not given fold away and the
#: planner picks the index of those given), never with a generic plan that must serve
#: every combination by walking one index past rows it then filters out.
UNPREPARED = frozenset(
    {
        "runs_list",
        "runs_list_newer",
        "runs_count",
        "runs_list_tagged",
        "runs_list_tagged_newer",
        "runs_count_tagged",
        "runs_count_tag_whole",
        "steps_list",
        "builds_list",
    }
)

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.M)


def load_queries() -> dict[str, sa.TextClause]:
    """Parse every family's .sql file into {name: statement}; a name given twice is an
    error."""
    queries: dict[str, sa.TextClause] = {}
    for family in FAMILIES:
        source = resources.files("service.db").joinpath(f"{family}.sql").read_text()
        parts = _NAME_LINE.split(source)
        for name, text in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ValueError(f"query {name} is named twice")
            queries[name] = sa.text(text.strip())
    return queries


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


class Pool:
    """The server's connections to its database, and the statements run on them."""

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
        self.database_url = database_url
        # Another node's pool is made alike (route).
        self._node_pool = functools.partial(
            Pool,
            pool_size=pool_size,
            statement_timeout_ms=statement_timeout_ms,
            on_ready=on_ready,
            on_acquire=on_acquire,
        )
        # On Citus, with routing on (Pool.route): the pool of the node that holds each
        # shard of the runs, for the shards that are not on the node this pool
        # connects to, and the pools by node. Empty otherwise: every call goes here.
        self.nodes: dict[int, Pool] = {}
        self._node_pools: dict[tuple[str, int], Pool] = {}
        # The nodes that hold shards of the runs by name ("host:port", as
        # pg_dist_node names them), this pool for its own node (route).
        self.named: dict[str, Pool] = {}
        self._routing = False
        # Whether the node this pool connects to holds shards of the runs (route).
        self.holds_shards = False
        # The hash ranges of the shards, to find the shard of any run (route).
        self.ranges = ShardRanges()
        self._routes_due = 0.0
        self._reading_routes: asyncio.Future[None] | None = None
        #: Connections taken from the pool so far.
        self.checkouts = 0
        # Whether the database is sharded (Citus); asked once, on first need.
        self.sharded: bool | None = None
        # On a sharded database: the shard of runs this server met (run id text ->
        # Citus shard id), to group a batch's outcomes by shard (service.db.shard_reports).
        self.shard_of: dict[str, int] = {}
        # On a sharded database: a run id in each shard (none is a run), to read each
        # shard alone while a node is down (service.db.shards).
        self.shard_runs: list[str] = []
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
        if self._reading_routes is not None:
            self._reading_routes.cancel()
        for node in self._node_pools.values():
            await node.close()
        await self.engine.dispose()

    async def route(self) -> None:
        """Send the calls that one shard serves (a claim's part of a shard, a shard's
        outcomes, a heartbeat) straight to the node that holds the shard, each node
        over a pool of its own, instead of through the node this pool connects to
        (Citus; docs/scaling.md). The map of the shards' nodes is read now and again
        every ROUTES_REFRESH_S."""
        self._routing = True
        await self._read_routes()

    async def _read_routes(self) -> None:
        rows = await self._all("shard_placements", Placement)
        self.ranges = ShardRanges([(row.low, row.high, row.shard) for row in rows])
        nodes: dict[int, Pool] = {}
        named: dict[str, Pool] = {}
        self.holds_shards = any(row.local for row in rows)
        for row in rows:
            if row.local:
                named[f"{row.host}:{row.port}"] = self
                continue
            where = (row.host, row.port)
            node = self._node_pools.get(where)
            if node is None:
                url = sa.engine.make_url(sql_url(self.database_url)).set(
                    host=row.host, port=row.port
                )
                node = self._node_pool(url.render_as_string(hide_password=False))
                node.sharded = True
                self._node_pools[where] = node
            nodes[row.shard] = node
            named[f"{row.host}:{row.port}"] = node
        self.nodes = nodes
        self.named = named
        self._routes_due = time.monotonic() + ROUTES_REFRESH_S

    async def _reread_routes(self) -> None:
        try:
            await self._read_routes()
        except Exception as exc:  # the map in use stays; tried again at the next due
            self._routes_due = time.monotonic() + ROUTES_REFRESH_S
            log.warning("could not read the nodes of the shards: %s", exc)

    def node_pools(self) -> list[Pool]:
        """The pools of the other nodes (route)."""
        return list(self._node_pools.values())

    def shard_holders(self) -> list[Pool]:
        """When the server routes: the pools of the nodes that hold shards of the runs,
        this one among them if its node does (empty when it does not route)."""
        if not self._routing:
            return []
        self.node_of(None)  # the map read again when due
        holders = list(dict.fromkeys(self.nodes.values()))
        return [self, *holders] if self.holds_shards else holders

    def named_holder(self, name: str) -> Pool:
        """The pool of the node called ``name`` ("host:port") that holds shards of the
        runs, this one for its own node (ClaimRequest.shard_node); InvalidArgument when
        the server does not route, or no such node holds any."""
        if not self._routing:
            raise errors.InvalidArgument(
                f"shard_node {name!r}: this server sends every call through the node of "
                "its database URL (--citus-route off), so it cannot claim from one node's "
                "shards; start it with --citus-route on, or leave shard_node empty"
            )
        self.node_of(None)  # the map read again when due
        node = self.named.get(name)
        if node is None:
            known = ", ".join(sorted(self.named)) or "none"
            raise errors.InvalidArgument(
                f"shard_node {name!r}: no such node holds shards of the runs (the nodes "
                f"that do, as the cluster names them: {known})"
            )
        return node

    def node_of(self, shard: int | None) -> Pool | None:
        """The pool of the node that holds ``shard``, when the server routes and that
        is not the node of this pool; else None."""
        if not self._routing:
            return None
        if time.monotonic() > self._routes_due and (
            self._reading_routes is None or self._reading_routes.done()
        ):
            self._routes_due = time.monotonic() + ROUTES_REFRESH_S
            self._reading_routes = asyncio.ensure_future(self._reread_routes())
        return self.nodes.get(shard) if shard is not None else None

    def shard_for(self, run_id: str) -> int | None:
        """The shard that holds ``run_id`` (a new run's too), from its hash, when the
        server routes; else None (the call then goes to the node of this pool)."""
        if not self._routing:
            return None
        self.node_of(None)  # the map read again when due
        return self.ranges.shard_of(run_id)

    def by_node(self, shards: Iterable[int | None]) -> list[tuple[Pool | None, list[int | None]]]:
        """``shards`` grouped by the node their calls are sent to (node_of: None for the
        node of this pool), in the order of each group's first shard."""
        groups: dict[int, tuple[Pool | None, list[int | None]]] = {}
        for shard in shards:
            node = self.node_of(shard)
            groups.setdefault(id(node), (node, []))[1].append(shard)
        return list(groups.values())

    async def _all_on(self, shard: int | None, name: str, row: type[R], **params: Any) -> list[R]:
        """_all for a call of one shard, on the node that holds it (node_of)."""
        node = self.node_of(shard)
        return await (self if node is None else node)._all(name, row, **params)

    async def _on_shard(
        self,
        driver: psycopg.AsyncConnection[Any] | None,
        shard: int | None,
        name: str,
        row: type[R],
        **params: Any,
    ) -> list[R]:
        """_run for a call of one shard: on the node that holds it (node_of), else on
        ``driver`` (which the caller checked out for such calls)."""
        node = self.node_of(shard)
        if node is None:
            assert driver is not None
            return await self._run(driver, name, row, **params)
        async with node._connection() as routed:
            return await self._run(routed, name, row, **params)

    def _connection_if(
        self, needed: bool
    ) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any] | None]:
        """_connection when ``needed``, else None and nothing checked out: for a call
        whose parts may all go to other nodes (_on_shard)."""
        return self._connection() if needed else contextlib.nullcontext()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection's psycopg connection, database errors translated."""
        # SQLAlchemy keeps the pool and compiles the named query once; the statement
        # itself runs on the psycopg connection underneath. Its execution layer cost
        # more CPU than the hot transitions themselves, and so did engine.connect()'s
        # wrappers around a check-out (docs/performance.md): the pool is used directly.
        self.checkouts += 1
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
            raise translate(exc) from exc
        except sa.exc.DBAPIError as exc:  # raised while connecting
            raise translate(exc.orig or exc) from exc
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

    async def is_sharded(self) -> bool:
        """Whether the run-level tables are distributed (Citus, docs/scaling.md): then
        claims, retention and key retention go run by run (95_shards.sql)."""
        if self.sharded is None:
            row = await self._one("sharded", Sharded)
            self.sharded = bool(row and row.sharded)
        return self.sharded

    def pool_status(self) -> tuple[int, int]:
        """(connections in use, connections open) of this server's pool."""
        pool = self.engine.pool
        return pool.checkedout(), pool.checkedout() + pool.checkedin()  # type: ignore[attr-defined]


class Repository:
    """One table family's queries, over the shared pool. Its helpers are the pool's
    own bound methods: no call in between on the way to the database."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._connection = pool._connection
        self._connection_if = pool._connection_if
        self._run = pool._run
        self._all = pool._all
        self._one = pool._one
        self._logged = pool._logged
        self._on_shard = pool._on_shard
        self._all_on = pool._all_on
        self._published = pool._published
        self.is_sharded = pool.is_sharded


def domain_error(sqlstate: str, message: str, detail: str | None) -> errors.CycloneError:
    """The domain error of an SQLSTATE the engine raised, with its message."""
    kind = codes.SQLSTATE_KINDS.get(sqlstate)
    if kind is codes.ErrorKind.LEASE_LOST:
        return errors.LeaseLost(message, current_attempt=codes.current_attempt(detail))
    return errors.of_kind(kind, message)


def translate(orig: BaseException) -> Exception:
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
    return domain_error(sqlstate, message, diag.message_detail if diag else None)
