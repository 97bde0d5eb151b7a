"""The `streams` scenario of `make bench` (bench/bench.py): what live readers of output
streams cost the claims. Throughput is measured as `throughput` measures it (one-node
runs drained by the bare-stub workers), without readers and with ``readers`` ReadStream
calls open on the same server, each following the stream of a run of its own that stays
running, in turns (without, then three times with and without); the figure is the
median over the rounds of the rate with readers over the mean of the drains without on
either side (target >= 0.9: readers slow claims by at most a tenth). Also reported: the
server's CPU per step with readers over without (``server_cpu_ratio``), which a machine
busy with other work disturbs less than the rate, and the server's CPU while only the
readers are open.

Each followed run holds one chunk (stored from SQL, as EmitChunks would store it), so
that a reader's first answer says it is open and waiting; the readers run in a process
of their own, on several channels, and end with their runs, cancelled at the end.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from typing import Any

import grpc
import psutil
import psycopg

from cyclone.v1 import workflow_service_pb2, workflow_service_pb2_grpc

#: Readers per channel (HTTP/2 connection).
PER_CHANNEL = 100
#: The held runs' stream.
STREAM = "tokens"


def hold_runs(database_url: str, submit_many: Any, one_node: Any, address: str, n: int) -> list:
    """``n`` one-node runs of an action no worker serves (they stay running), each with
    one chunk in its stream; their ids."""
    submit_many(address, [one_node("held", "stream-hold")] * n)
    with psycopg.connect(database_url) as conn:
        ids = [
            str(r[0])
            for r in conn.execute(
                "SELECT run_id FROM cyclone.runs WHERE workflow = 'held' AND status = 'running'"
            ).fetchall()
        ]
        conn.execute(
            "INSERT INTO cyclone.stream_chunks (run_id, stream, pos, node, step_id, seq, "
            "attempt, at, data, json) SELECT r, %s, 0, 'held', '', 1, 1, now(), 'ready', "
            "false FROM unnest(%s::uuid[]) r",
            (STREAM, ids),
        )
    return ids


def readers_process(address: str, run_ids: list, ready, stop) -> None:
    """Follow each run's stream until ``stop`` is set; ``ready`` counts the readers that
    got their first chunk (open and waiting)."""

    async def main() -> None:
        channels = [grpc.aio.insecure_channel(address) for _ in range(0, len(run_ids), PER_CHANNEL)]
        calls = []

        async def follow(i: int, run_id: str) -> None:
            stub = workflow_service_pb2_grpc.WorkflowServiceStub(channels[i // PER_CHANNEL])
            call = stub.ReadStream(
                workflow_service_pb2.ReadStreamRequest(run_id=run_id, stream=STREAM)
            )
            calls.append(call)
            try:
                async for _ in call:
                    with ready.get_lock():
                        ready.value += 1
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    raise

        tasks = [asyncio.create_task(follow(i, r)) for i, r in enumerate(run_ids)]
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for call in calls:
            call.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()

    asyncio.run(main())


#: Rounds of (readers open, readers closed) after the first drain without readers.
ROUNDS = 3


def _open_readers(address: str, run_ids: list) -> tuple[Any, Any, Any]:
    """A process of ``len(run_ids)`` readers, each waiting on its stream: (process,
    ready, stop)."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Value("i", 0), ctx.Event()
    process = ctx.Process(target=readers_process, args=(address, run_ids, ready, stop))
    process.start()
    give_up = time.monotonic() + 120
    while ready.value < len(run_ids):
        if time.monotonic() > give_up or not process.is_alive():
            stop.set()
            raise RuntimeError(f"only {ready.value} of {len(run_ids)} stream readers opened")
        time.sleep(0.1)
    return process, ready, stop


def scenario(bench: Any, server: Any, database_url: str, runs: int, readers: int) -> dict:
    """Drains without readers and with ``readers`` open, taking turns: without, then
    ROUNDS times (with, without). Each drain with readers is compared with the mean of
    the drains without on either side of it; the figures are the medians of the
    rounds', so that one burst of other work on the machine moves one round only."""
    run_ids = hold_runs(database_url, bench.submit_many, bench.one_node, server.address, readers)
    without = [bench.scenario_throughput(server, database_url, runs, "stream-without-0")]
    during: list[dict] = []
    idle = readers_pct = 0.0
    still_open = True
    for turn in range(ROUNDS):
        process, ready, stop = _open_readers(server.address, run_ids)
        try:
            if turn == 0:
                idle = idle_cpu(server.proc.pid)
            readers_cpu = psutil.Process(process.pid)
            readers_start, started = sum(readers_cpu.cpu_times()[:2]), time.monotonic()
            during.append(
                bench.scenario_throughput(server, database_url, runs, f"stream-with-{turn}")
            )
            used = sum(readers_cpu.cpu_times()[:2]) - readers_start
            readers_pct = max(readers_pct, round(100 * used / (time.monotonic() - started), 1))
            still_open = still_open and ready.value == readers and process.is_alive()
        finally:
            stop.set()
            process.join(60)
        without.append(
            bench.scenario_throughput(server, database_url, runs, f"stream-without-{turn + 1}")
        )

    def rate(d: dict) -> float:
        return d["steps_per_s"]

    def server_cpu(d: dict) -> float:
        return d["cpu_ms_per_step"]["server"]

    def ratios(of: Any) -> list[float]:
        return [
            round(of(w) / ((of(without[i]) + of(without[i + 1])) / 2), 2)
            for i, w in enumerate(during)
        ]

    rate_ratios, cpu_ratios = ratios(rate), ratios(server_cpu)
    return {
        "readers": readers,
        "rounds": ROUNDS,
        "readers_open_throughout": still_open,
        "steps_per_s_without": round(statistics.median(map(rate, without)), 1),
        "steps_per_s_with": round(statistics.median(map(rate, during)), 1),
        "cpu_ms_per_step_without": without[0]["cpu_ms_per_step"],
        "cpu_ms_per_step_with": during[0]["cpu_ms_per_step"],
        "ratio": statistics.median(rate_ratios),
        "round_ratios": rate_ratios,
        # The server's CPU per step with readers over without: what they cost the claims,
        # less sensitive than the rate to a machine shared with other work.
        "server_cpu_ratio": statistics.median(cpu_ratios),
        "round_server_cpu_ratios": cpu_ratios,
        # The server's CPU while the readers wait and nothing else runs (% of one CPU).
        "server_idle_cpu_pct_with_readers": idle,
        # The readers' own process (the bench's clients) during a drain, % of a CPU (the
        # most of the rounds): on a small machine it competes with the server, the
        # workers and Postgres.
        "readers_process_cpu_pct": readers_pct,
    }


def idle_cpu(pid: int, seconds: float = 5.0) -> float:
    """The CPU a process spends in ``seconds`` of quiet, as a percentage of one CPU."""
    process = psutil.Process(pid)
    start = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    return round(100 * (sum(process.cpu_times()[:2]) - start) / seconds, 1)
