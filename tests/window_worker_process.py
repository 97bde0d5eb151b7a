"""A worker process for tests/test_durable_window.py, meant to be killed with SIGKILL.

    python window_worker_process.py ADDRESS EFFECTS_FILE [--hold] [--slow-ends SECONDS]
                                    [--record window|async] [--gated]

Every call of a step function appends a JSON line (run_id, attempt, step, phase, pid)
to EFFECTS_FILE and syncs it before going on: an effect no transaction can take back,
so the lines count how often each step really ran.

Durable functions (actions):

``two_then_hold`` / ``two_then_hold_async`` (the same body, sync and async)
    ``s1``, ``s2``, then ``hold``. With --hold, ``hold`` writes a line with phase
    "paused" and waits until the process is killed; without, it returns at once.

``--slow-ends SECONDS`` holds every CompleteMany that carries step call ends that long
before sending it: the records of the calls are still on their way when the body goes
on. ``--record async`` makes ``s1`` and ``s2`` ``@step(record="async")``. With --gated
the worker starts claiming only when a line arrives on stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
from typing import Any

from pyclient import Worker, current, step
from pyclient.worker._completer import Completer


def slow_ends(seconds: float) -> None:
    """Hold each CompleteMany that carries step call ends ``seconds`` before it leaves."""
    send = Completer._send

    async def held(self: Completer, request: Any, **kwargs: Any) -> Any:
        if request.step_call_ends:
            await asyncio.sleep(seconds)
        return await send(self, request, **kwargs)

    Completer._send = held  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("effects_file")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--slow-ends", type=float, default=0.0)
    parser.add_argument("--record", choices=["window", "async"], default="window")
    parser.add_argument("--gated", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.slow_ends:
        slow_ends(args.slow_ends)
    lock = threading.Lock()

    def record(name: str, phase: str = "effect") -> None:
        ctx = current()
        line = {
            "run_id": ctx.run_id,
            "attempt": ctx.attempt,
            "step": name,
            "phase": phase,
            "pid": os.getpid(),
        }
        with lock, open(args.effects_file, "a") as effects:
            effects.write(json.dumps(line) + "\n")
            effects.flush()
            os.fsync(effects.fileno())

    worker = Worker(args.address, concurrency=1, lease=2.0, claim_wait=5.0)
    recorded = step(record="async") if args.record == "async" else step

    @recorded
    def s1() -> int:
        record("s1")
        return 1

    @recorded
    def s2(a: int) -> int:
        record("s2")
        return a + 1

    @step
    def hold(b: int) -> int:
        record("hold")
        if args.hold:
            record("hold", "paused")
            threading.Event().wait()  # until the test kills the process
        return b + 1

    @worker.workflow("two_then_hold")
    def two_then_hold(ctx: Any) -> int:
        return hold(s2(s1()))

    @recorded
    async def s1_async() -> int:
        record("s1")
        return 1

    @recorded
    async def s2_async(a: int) -> int:
        record("s2")
        return a + 1

    @step
    async def hold_async(b: int) -> int:
        record("hold")
        if args.hold:
            record("hold", "paused")
            await asyncio.Event().wait()  # until the test kills the process
        return b + 1

    @worker.workflow("two_then_hold_async")
    async def two_then_hold_async(ctx: Any) -> int:
        return await hold_async(await s2_async(await s1_async()))

    if args.gated:
        sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
