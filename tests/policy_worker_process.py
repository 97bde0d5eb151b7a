"""A worker process serving a durable function whose step retries with a long durable
backoff, for tests/test_step_policies_processes.py; meant to be killed with SIGKILL.

    python policy_worker_process.py ADDRESS EFFECTS_FILE [--gated]

``flaky_order``: calls ``charge(order_id)``, a step with ``retries=3`` and a backoff of
an hour (then two), which fails on its first two tries (step ids ``charge`` and
``charge~2``) and succeeds on the third (``charge~3``). Each try appends a JSON line
(step id, attempt, pid) to EFFECTS_FILE, synced to disk: an effect no transaction can
take back, so the lines count the tries that really ran.

With --gated the worker starts claiming only when a line arrives on stdin.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from pyclient import Worker, current, step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("effects_file")
    parser.add_argument("--gated", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    @step(retries=3, backoff=3600)
    def charge(order_id: str) -> str:
        ctx = current()
        line = {"step_id": ctx.step_id, "attempt": ctx.attempt, "pid": os.getpid()}
        with open(args.effects_file, "a") as effects:
            effects.write(json.dumps(line) + "\n")
            effects.flush()
            os.fsync(effects.fileno())
        if not (ctx.step_id or "").endswith("~3"):
            raise ConnectionError(f"{ctx.step_id}: connection reset")
        return f"charged {order_id}"

    worker = Worker(args.address, concurrency=1, lease=2.0, claim_wait=5.0)

    @worker.workflow("flaky_order")
    def flaky_order(ctx, order_id: str) -> str:
        return charge(order_id)

    if args.gated:
        sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
