"""The Python SDK's conformance worker: serves the actions of tests/conformance/README.md.

    python -m tests.conformance.python_worker --address A --database-url URL \
        --effects FILE [--lease S] [--concurrency N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from typing import Any

from pyclient import Worker, current, sleep, start_child, step, wait_for_event
from pyclient.completion import CompletionTx

LEDGER = "INSERT INTO conformance_ledger (run_id, node, entry, attempt) VALUES (%s, %s, %s, %s)"
#: The exit status of a planned crash.
CRASHED = 3


class PlannedFailure(Exception):
    """The failure a spec's ``fail_attempts`` asks for."""


class Effects:
    """The effects file: a line per effect, on disk before the worker goes on."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def write(self, name: str, phase: str = "effect", step: tuple | None = None) -> None:
        """Append a line for the current step, or ``step`` (run id, node, attempt)."""
        if step is None:
            ctx = current()
            step = (ctx.run_id, ctx.node, ctx.attempt)
        run_id, node, attempt = step
        line = {
            "run_id": run_id,
            "node": node,
            "attempt": attempt,
            "name": name,
            "phase": phase,
            "lang": "python",
            "time": time.time(),
        }
        with self.lock, open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def crash_if(self, spec: dict, point: str, name: str) -> None:
        """Crash here when ``spec`` asks for ``point`` on this attempt."""
        if spec.get("crash") == point and current().attempt in spec.get("crash_attempts", [1]):
            self.write(name, "crash")
            os._exit(CRASHED)


def make_worker(args: argparse.Namespace) -> Worker:
    effects = Effects(args.effects)
    worker = Worker(
        args.address,
        database_url=args.database_url,
        concurrency=args.concurrency,
        lease=args.lease,
        claim_wait=1.0,
        shutdown_grace=1.0,
        reconnect_max_delay=0.5,
    )

    @worker.action("conformance.task")
    def task(ctx: Any, spec: dict | None) -> dict:
        spec = spec or {}
        effects.write(ctx.node)
        effects.crash_if(spec, "after_effect", ctx.node)
        if ctx.attempt <= spec.get("fail_attempts", 0):
            raise PlannedFailure(f"planned failure {ctx.attempt}")
        if spec.get("unencodable_output"):
            return {"tags": {"a", "b"}}  # a set: JSON has none
        if "big_output" in spec:
            return {"text": "x" * spec["big_output"]}
        return {
            "value": spec.get("value"),
            "attempt": ctx.attempt,
            "upstream": sorted(ctx.upstream),
        }

    # The ledger steps to crash right after their commit: (run id, node) -> (entry, attempt).
    after_commit: dict[tuple[str, str], tuple[str, int]] = {}
    commit = CompletionTx.commit

    def commit_then_crash(tx: CompletionTx, output_json: str) -> None:
        commit(tx, output_json)
        run_id, node = tx._key[:2]
        if (run_id, node) in after_commit:
            entry, attempt = after_commit[(run_id, node)]
            effects.write(entry, "crash", (run_id, node, attempt))
            os._exit(CRASHED)

    CompletionTx.commit = commit_then_crash  # type: ignore[method-assign]

    @worker.action("conformance.ledger")
    def ledger(ctx: Any, spec: dict | None) -> dict:
        spec = spec or {}
        if ctx.attempt in spec.get("hold_attempts", []):
            effects.write(spec["entry"], "holding")
            time.sleep(spec.get("hold_seconds", 1))
            effects.write(spec["entry"], "held")
        ctx.completion_tx().execute(LEDGER, (ctx.run_id, ctx.node, spec["entry"], ctx.attempt))
        effects.write(spec["entry"])
        effects.crash_if(spec, "before_commit", spec["entry"])
        if spec.get("crash") == "after_commit" and ctx.attempt in spec.get("crash_attempts", [1]):
            after_commit[(ctx.run_id, ctx.node)] = (spec["entry"], ctx.attempt)
        return {"entry": spec["entry"], "attempt": ctx.attempt}

    # What each step call of a body does, by (run, node, step id): a step's only argument
    # is its id, so that every language records the same arguments digest.
    ops: dict[tuple[str, str, str], dict] = {}

    def run_op(step_id: str) -> Any:
        ctx = current()
        op = ops[(ctx.run_id, ctx.node, step_id)]
        effects.crash_if(op, "before_effect", step_id)
        effects.write(step_id)
        effects.crash_if(op, "after_effect", step_id)
        return op.get("result")

    effect = step(name="conformance.effect")(run_op)
    unsafe_effect = step(name="conformance.unsafe_effect", unsafe_to_repeat=True)(run_op)

    @worker.workflow("conformance.body")
    def body(ctx: Any, spec: dict | None) -> dict:
        spec = spec or {}
        results: list[Any] = []
        for op in spec.get("calls", []):
            if "step" in op:
                ops[(ctx.run_id, ctx.node, op["step"])] = op
                fn = unsafe_effect if op.get("unsafe") else effect
                results.append(fn.with_step_id(op["step"])(op["step"]))
                effects.crash_if(op, "after_call", op["step"])
            elif "sleep" in op:
                results.append(sleep(op["sleep"]))
            elif "event" in op:
                effects.write(op["event"], "waiting")
                results.append(wait_for_event(op["event"], timeout=op.get("timeout")))
            elif "child" in op:
                results.append(start_child("conformance.body", {"calls": op["child"]}).result())
            else:
                raise ValueError(f"unknown operation {op!r}")
        return {"results": results}

    return worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    make_worker(args).run()


if __name__ == "__main__":
    main()
