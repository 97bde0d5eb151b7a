"""The db wing: the only code that talks SQL.

:class:`Database` composes one repository per table family over one pool; the api
and engine wings call those (``db.runs.run_submit``, ``db.steps.step_claim``...).
Imports nothing of service.api or service.engine.
"""

from __future__ import annotations

from collections.abc import Callable

from service.db.builds import Builds
from service.db.bulk import Bulk
from service.db.callbacks import Callbacks
from service.db.claim import Steps
from service.db.completion import Reports
from service.db.operator import Operator
from service.db.pool import Pool
from service.db.queries import Queries
from service.db.retention import Retention
from service.db.runs import Runs
from service.db.schedules import Schedules
from service.db.shard_reports import ShardReports
from service.db.streams import Streams
from service.db.waits import Waits
from service.db.workers import Workers


class Database:
    """The server's database: its pool and a repository per table family."""

    def __init__(
        self,
        database_url: str,
        *,
        pool_size: int = 10,
        statement_timeout_ms: int = 0,
        on_ready: Callable[[set[str]], None] | None = None,
        on_acquire: Callable[[float], None] | None = None,
        route_shards: bool = True,
    ) -> None:
        #: On Citus: send each shard's calls to the node that holds it (Pool.route).
        self.route_shards = route_shards
        self.pool = Pool(
            database_url,
            pool_size=pool_size,
            statement_timeout_ms=statement_timeout_ms,
            on_ready=on_ready,
            on_acquire=on_acquire,
        )
        self.runs = Runs(self.pool)
        self.steps = Steps(self.pool)
        self.shard_reports = ShardReports(self.pool)
        self.reports = Reports(self.pool, self.shard_reports)
        self.waits = Waits(self.pool)
        self.operator = Operator(self.pool)
        self.retention = Retention(self.pool)
        self.workers = Workers(self.pool)
        self.schedules = Schedules(self.pool)
        self.builds = Builds(self.pool)
        self.bulk = Bulk(self.pool)
        self.streams = Streams(self.pool)
        self.callbacks = Callbacks(self.pool)
        self.queries = Queries(self.pool)

    async def start(self) -> None:
        """Ask the database once whether it is sharded (Citus), and serve it so; on
        Citus, read where its shards live to route calls there (route_shards)."""
        sharded = await self.pool.is_sharded()
        self.shard(sharded)
        if sharded and self.route_shards:
            await self.pool.route()

    def shard(self, sharded: bool) -> None:
        """Serve a sharded database, or a plain one: the claim is chosen here, and the
        few statements that differ on Citus follow ``pool.sharded``."""
        self.pool.sharded = sharded
        self.steps.choose(sharded)

    def pool_status(self) -> tuple[int, int]:
        return self.pool.pool_status()

    async def close(self) -> None:
        await self.pool.close()
