"""A worker process for tests/test_unsafe_processes.py, meant to be killed with SIGKILL.

    python unsafe_worker_process.py ADDRESS CALLS_FILE MODE [--safe] [--gated]

Serves the order workflow's actions. Every call appends a JSON line (run_id, node,
attempt, phase, detail, at) to CALLS_FILE and syncs it to disk before going on, so
the line stays whatever happens to the step: it stands for an effect on an outside
system, which no transaction of Cyclone can take back.

"charge" writes phase "entered" as it starts and phase "effect" once its effect is
done, then returns {"charge_id": "ch-ATTEMPT"}. MODE changes that:

    effect        as above
    hang-after    hangs after the effect (the worker dies with the effect done)
    hang-before   hangs before the effect (a crash between the claim and the effect)

It is registered unsafe_to_repeat=True, unless --safe (the mark removed from the code).
"receipt" and "refund" write one "effect" row each, with the upstream outputs as detail.

With --gated the worker starts claiming only when a line arrives on stdin, so a test
can start it early (Python takes a while to start) and let it loose when it is time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

from pyclient import Worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("calls_file")
    parser.add_argument("mode", choices=["effect", "hang-after", "hang-before"])
    parser.add_argument("--safe", action="store_true")
    parser.add_argument("--gated", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    lock = threading.Lock()

    def record(ctx, phase: str, detail=None) -> None:
        line = {
            "run_id": ctx.run_id,
            "node": ctx.node,
            "attempt": ctx.attempt,
            "phase": phase,
            "detail": detail,
            "at": time.time(),
        }
        with lock, open(args.calls_file, "a") as calls:
            calls.write(json.dumps(line) + "\n")
            calls.flush()
            os.fsync(calls.fileno())

    def hang() -> None:
        threading.Event().wait()  # until the test kills the process

    # One slot: while the handler runs, no claim is outstanding that a kill could orphan.
    worker = Worker(args.address, concurrency=1, lease=2.0, claim_wait=5.0)

    @worker.action("charge", unsafe_to_repeat=not args.safe)
    def charge(ctx):
        record(ctx, "entered")
        if args.mode == "hang-before":
            hang()
        record(ctx, "effect")
        if args.mode == "hang-after":
            hang()
        return {"charge_id": f"ch-{ctx.attempt}"}

    @worker.action("receipt")
    def receipt(ctx):
        record(ctx, "effect", dict(ctx.upstream))
        return "sent"

    @worker.action("refund")
    def refund(ctx):
        record(ctx, "effect", dict(ctx.upstream))
        return "refunded"

    if args.gated:
        sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
