"""The `streams` scenario of `make bench` (bench/bench.py): what live readers of output
streams cost the claims. Throughput is measured as `throughput` measures it (one-node
runs drained by the bare-stub workers), without readers, then with ``readers`` ReadStream
calls open on the same server, each following the stream of a run of its own that stays
running, then without again; the figure is the rate with readers over the mean of the
two without (target >= 0.9: readers slow claims by at most a tenth). Also reported: the
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


def scenario(bench: Any, server: Any, database_url: str, runs: int, readers: int) -> dict:
    """Throughput without readers, with ``readers`` open, and without again."""
    run_ids = hold_runs(database_url, bench.submit_many, bench.one_node, server.address, readers)
    before = bench.scenario_throughput(server, database_url, runs, "stream-before")
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Value("i", 0), ctx.Event()
    process = ctx.Process(target=readers_process, args=(server.address, run_ids, ready, stop))
    process.start()
    give_up = time.monotonic() + 120
    while ready.value < readers:
        if time.monotonic() > give_up or not process.is_alive():
            raise RuntimeError(f"only {ready.value} of {readers} stream readers opened")
        time.sleep(0.1)
    try:
        idle = idle_cpu(server.proc.pid)
        readers_cpu = psutil.Process(process.pid)
        readers_start, started = sum(readers_cpu.cpu_times()[:2]), time.monotonic()
        during = bench.scenario_throughput(server, database_url, runs, "stream-during")
        readers_pct = round(
            100 * (sum(readers_cpu.cpu_times()[:2]) - readers_start) / (time.monotonic() - started),
            1,
        )
        still_open = ready.value == readers and process.is_alive()
    finally:
        stop.set()
        process.join(60)
    after = bench.scenario_throughput(server, database_url, runs, "stream-after")
    without = (before["steps_per_s"] + after["steps_per_s"]) / 2
    cpu_without = (before["cpu_ms_per_step"]["server"] + after["cpu_ms_per_step"]["server"]) / 2
    return {
        "readers": readers,
        "readers_open_throughout": still_open,
        "steps_per_s_without": {"before": before["steps_per_s"], "after": after["steps_per_s"]},
        "steps_per_s_with": during["steps_per_s"],
        "cpu_ms_per_step_without": before["cpu_ms_per_step"],
        "cpu_ms_per_step_with": during["cpu_ms_per_step"],
        "ratio": round(during["steps_per_s"] / without, 2),
        # The server's CPU per step with readers over without: what they cost the claims,
        # less sensitive than the rate to a machine shared with other work.
        "server_cpu_ratio": round(during["cpu_ms_per_step"]["server"] / cpu_without, 2),
        # The server's CPU while the readers wait and nothing else runs (% of one CPU).
        "server_idle_cpu_pct_with_readers": idle,
        # The readers' own process (the bench's clients) meanwhile, % of a CPU: on a
        # small machine it competes with the server, the workers and Postgres.
        "readers_process_cpu_pct": readers_pct,
    }


def idle_cpu(pid: int, seconds: float = 5.0) -> float:
    """The CPU a process spends in ``seconds`` of quiet, as a percentage of one CPU."""
    process = psutil.Process(pid)
    start = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    return round(100 * (sum(process.cpu_times()[:2]) - start) / seconds, 1)
