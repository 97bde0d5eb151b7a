"""A worker process for the crash-matrix tests (tests/test_crash_matrix.py).

    python -m tests.crash_worker ADDRESS DATABASE_URL

Serves the action "charge" with one handler slot: it writes an audit row on a
connection of its own (committed at once: at-least-once), then a ledger row on
``ctx.completion_tx()`` (committed with the completion: exactly once), and returns
``{"attempt": n}``. Every ledger and audit row records the attempt that wrote it.

Test-only hooks, read from the environment, kept here rather than in the SDK:

``CYCLONE_TEST_PAUSE_AT``
    ``before_effect``, ``after_effect`` or ``after_commit``: at that point of the first
    step this process runs, print ``paused <point> <run_id> <attempt>`` on stdout and
    block until a line arrives on stdin. The test SIGKILLs (or SIGSTOPs) it there.
    ``after_commit`` is right after the SDK committed the completion transaction,
    before the worker goes on.
``CYCLONE_TEST_RAISE``
    ``1``: the handler raises after its effects on attempt 1.
``CYCLONE_TEST_LEASE``
    the worker's lease in seconds (default 5).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import psycopg

from pyclient import Worker
from pyclient.completion import CompletionTx

LEDGER = "INSERT INTO ledger (run_id, node, attempt) VALUES (%s, %s, %s)"
AUDIT = "INSERT INTO audit (run_id, node, attempt) VALUES (%s, %s, %s)"

_paused_once = threading.Lock()
#: (run_id, attempt) of the step the handler last ran (one handler slot).
_last_step: tuple[str, int] = ("", 0)


def pause(point: str, run_id: str, attempt: int) -> None:
    """Stop here if the test asked for this point (once per process)."""
    if os.environ.get("CYCLONE_TEST_PAUSE_AT") != point or not _paused_once.acquire(False):
        return
    print(f"paused {point} {run_id} {attempt}", flush=True)
    sys.stdin.readline()
    print(f"resumed {point} {run_id} {attempt}", flush=True)


def pause_after_commit() -> None:
    """Wrap the SDK's commit of the completion transaction with the after_commit point."""
    commit = CompletionTx.commit

    def commit_then_pause(self: CompletionTx, output_json: str) -> None:
        commit(self, output_json)
        pause("after_commit", *_last_step)

    CompletionTx.commit = commit_then_pause  # type: ignore[method-assign]


def main() -> None:
    address, database_url = sys.argv[1:3]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    lease = float(os.environ.get("CYCLONE_TEST_LEASE", "5"))
    worker = Worker(
        address,
        database_url=database_url,
        concurrency=1,
        lease=lease,
        claim_wait=1.0,
        shutdown_grace=1.0,
        reconnect_max_delay=0.5,
    )
    pause_after_commit()

    @worker.action("charge")
    def charge(ctx):
        global _last_step
        _last_step = (ctx.run_id, ctx.attempt)
        pause("before_effect", ctx.run_id, ctx.attempt)
        with psycopg.connect(database_url, autocommit=True) as audit:
            audit.execute(AUDIT, (ctx.run_id, ctx.node, ctx.attempt))
        ctx.completion_tx().execute(LEDGER, (ctx.run_id, ctx.node, ctx.attempt))
        pause("after_effect", ctx.run_id, ctx.attempt)
        if os.environ.get("CYCLONE_TEST_RAISE") == "1" and ctx.attempt == 1:
            raise RuntimeError("the card gateway timed out after the charge")
        return {"attempt": ctx.attempt}

    worker.run()


if __name__ == "__main__":
    main()
