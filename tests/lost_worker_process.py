"""A worker process serving one durable function, for tests/test_worker_recovery.py; meant
to be killed with SIGKILL or stopped with SIGSTOP.

    python lost_worker_process.py ADDRESS EFFECTS_FILE --worker-id ID [--hang]
                                  [--release-file PATH] [--concurrency N]

``hold`` calls the step function ``first`` and returns ``{"a": ..., "worker": ID}``.
With ``--hang`` its body stops after ``first``, writes a line with phase "paused" and
waits until ``--release-file`` exists (for good without one). Every line, appended to
EFFECTS_FILE and synced to disk, holds the run, the attempt, the worker id and the pid.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from pathlib import Path

from pyclient import Worker, current, step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("effects_file")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--release-file")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    lock = threading.Lock()

    def record(name: str, phase: str = "effect") -> None:
        ctx = current()
        line = {
            "run_id": ctx.run_id,
            "attempt": ctx.attempt,
            "step": name,
            "phase": phase,
            "worker": args.worker_id,
            "pid": os.getpid(),
        }
        with lock, open(args.effects_file, "a") as effects:
            effects.write(json.dumps(line) + "\n")
            effects.flush()
            os.fsync(effects.fileno())

    worker = Worker(
        args.address,
        worker_id=args.worker_id,
        concurrency=args.concurrency,
        lease=2.0,
        claim_wait=5.0,
    )

    @step
    def first(n: int) -> int:
        record("first")
        return n + 1

    @worker.workflow("hold")
    def hold(ctx, data: dict) -> dict:
        a = first(data["n"])
        if args.hang:
            record("hold", "paused")
            release = Path(args.release_file) if args.release_file else None
            while release is None or not release.exists():
                time.sleep(0.05)
        record("hold")
        return {"a": a, "worker": args.worker_id}

    worker.run()


if __name__ == "__main__":
    main()
