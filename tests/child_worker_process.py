"""A worker process serving a parent durable function that starts a child run, for
tests/test_child_processes.py; meant to be killed with SIGKILL.

    python child_worker_process.py ADDRESS EFFECTS_FILE [--hang after-start] [--gated]

``parent`` (input ``{"n": n}``): appends a line (phase "effect", step "start") before
``start_child("kid", {"n": n})``, then one (phase "started", the child's run id) after
it; ``--hang after-start`` hangs the body there, just after StartChild answered, with
a line of phase "paused". It returns ``{"child": run_id, "result": child.result()}``.
``kid`` doubles its input's ``n``. Every line is synced to disk before the body goes
on, so it stays whatever happens to the process.

With --gated the worker starts claiming only when a line arrives on stdin.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading

from pyclient import Worker, current, start_child


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("effects_file")
    parser.add_argument("--hang", choices=["after-start"])
    parser.add_argument("--gated", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    lock = threading.Lock()

    def record(name: str, phase: str = "effect", detail: object = None) -> None:
        ctx = current()
        line = {
            "run_id": ctx.run_id,
            "node": ctx.node,
            "attempt": ctx.attempt,
            "step": name,
            "phase": phase,
            "detail": detail,
            "pid": os.getpid(),
        }
        with lock, open(args.effects_file, "a") as effects:
            effects.write(json.dumps(line) + "\n")
            effects.flush()
            os.fsync(effects.fileno())

    # One slot: while the body hangs in it, no claim is outstanding that a kill could
    # orphan; a parent waiting for its child gives it up, so the child runs in it.
    worker = Worker(args.address, concurrency=1, lease=2.0, claim_wait=5.0)

    @worker.workflow("kid")
    def kid(ctx, data: dict) -> dict:
        return {"double": data["n"] * 2}

    @worker.workflow("parent")
    def parent(ctx, data: dict) -> dict:
        record("start")
        child = start_child("kid", {"n": data["n"]})
        record("start", "started", child.run_id)
        if args.hang == "after-start":
            record("start", "paused", child.run_id)
            threading.Event().wait()  # until the test kills the process
        return {"child": child.run_id, "result": child.result()}

    if args.gated:
        sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
