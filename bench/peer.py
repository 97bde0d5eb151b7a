"""The same-run peer of `make bench`: pgqueuer, a Postgres job queue for Python (the
PyPI package, pinned in pyproject.toml's dev extra), draining the same count of no-op
jobs on the same Postgres as Cyclone's `throughput` and `sdk` scenarios, at its best
settings: several queue managers, each a process on its own asyncpg connection,
dequeuing 50 jobs at a time.

Its rate is taken from its own log as Cyclone's is from its steps: jobs over the span
from the first job picked to the last one done. Its CPU is that of its processes and of
Postgres, measured as Cyclone's is (bench.CpuMeter); the Postgres figure is read while
the queue managers' connections are still open, since a backend that has exited can no
longer be measured.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from datetime import timedelta

import psycopg

#: Queue managers (processes) and jobs dequeued at a time: pgqueuer's throughput
#: settings (its own benchmark runs several managers with batches of this size).
MANAGERS = 5
BATCH = 50
#: The entrypoint every job names.
ENTRYPOINT = "bench_noop"
#: How long the bench waits for a drain before it gives up.
DEADLINE_S = 600


def _manager_process(url: str, finished, released) -> None:
    """One queue manager serving ENTRYPOINT with a no-op until ``finished`` is set; its
    connection stays open until ``released``."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    from bench import worker_ready

    async def main() -> None:
        conn = await asyncpg.connect(url)
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job) -> None:
            return None

        async def stop_when_finished() -> None:
            await asyncio.to_thread(finished.wait)
            manager.shutdown.set()

        stopper = asyncio.ensure_future(stop_when_finished())
        worker_ready()
        await manager.run(batch_size=BATCH, dequeue_timeout=timedelta(seconds=1))
        await stopper
        await asyncio.to_thread(released.wait)
        await conn.close()

    asyncio.run(main())


def install(url: str) -> None:
    """pgqueuer's tables, in the bench database (once per bench run)."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await asyncpg.connect(url)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    asyncio.run(main())


def enqueue(url: str, jobs: int) -> None:
    """``jobs`` no-op jobs, 1,000 to a batch, with pgqueuer's own enqueue."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            for start in range(0, jobs, 1000):
                n = min(1000, jobs - start)
                await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        finally:
            await conn.close()

    asyncio.run(main())


def scenario_pgqueuer(database_url: str, jobs: int, meter_type) -> dict:
    """Drain ``jobs`` no-op jobs with MANAGERS queue managers; jobs per second and CPU
    per job (``meter_type``: bench.CpuMeter)."""
    from bench import join, vacuumed

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
    enqueue(database_url, jobs)
    vacuumed(database_url)
    ctx = multiprocessing.get_context("spawn")
    finished, released = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=_manager_process, args=(database_url, finished, released))
        for _ in range(MANAGERS)
    ]
    with meter_type(None) as cpu, psycopg.connect(database_url, autocommit=True) as conn:
        for p in procs:
            p.start()
        deadline = time.monotonic() + DEADLINE_S
        done = 0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            done = conn.execute(
                "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
            ).fetchone()[0]
            if done == jobs:
                break
        finished.set()
        cpu.postgres_now()
        released.set()
        join(procs)
    with psycopg.connect(database_url) as conn:
        picked, last = conn.execute(
            "SELECT (SELECT min(created) FROM pgqueuer_log WHERE status = 'picked'),"
            " (SELECT max(created) FROM pgqueuer_log WHERE status = 'successful')"
        ).fetchone()
    assert done == jobs, f"pgqueuer did {done} of {jobs} jobs"
    return {
        "jobs": jobs,
        "managers": MANAGERS,
        "batch": BATCH,
        "jobs_per_s": round(jobs / (last - picked).total_seconds(), 1),
        "cpu_ms_per_job": cpu.per_step(jobs, "workers", "postgres"),
    }
