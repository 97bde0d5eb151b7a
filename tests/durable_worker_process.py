"""A worker process serving durable functions, for tests/test_durable_processes.py; meant
to be killed with SIGKILL.

    python durable_worker_process.py ADDRESS EFFECTS_FILE [--hang POINT] [--safe]
                                     [--gated] [--database-url URL] [--die-at STEP_ID:WHEN]

Every step call appends a JSON line (run_id, node, attempt, step, phase, detail, pid)
to EFFECTS_FILE and syncs it to disk before going on, so the line stays whatever
happens to the process: it stands for an effect on an outside system, which no
transaction of Cyclone can take back. The bodies also write a line with phase
"paused" where --hang stops them, so the test knows when to kill.

Durable functions (actions):

``three_steps``
    ``first``, ``second``, ``third`` one after the other, each fed the last one's value.
    ``--hang before-third`` hangs the body between the second and the third call.
``napper``
    ``first``, then a durable ``sleep`` (input ``sleep`` seconds, default 1) or, with
    ``"event": true`` in the input, ``wait_for_event("go")``, then ``third``.
    ``--hang before-wait`` / ``after-wait`` hangs the body just before the wait, or
    just after it returned (on the attempt that resumed).
``counter``
    ``first``, then ``wait_for_event("go")``, then ``third``; its update handler
    ``add(k)`` adds ``k`` to a total (writing a line of phase "applied" each time it
    runs, first time or replay), its query handler ``total`` reads it.
    ``--hang after-wait`` hangs the body just after the wait returned.
``parent``
    ``first``, then ``start_child("kid", {"n": ...})`` (a child run of ``kid``, which
    doubles ``n``), then waits for its result and returns it with the child's id.
    ``--hang after-start`` hangs the body just after StartChild answered.
``order``
    ``reserve`` (safe), then ``charge_card`` (unsafe_to_repeat; ``--safe`` removes the
    mark, as a deploy would) inside ``try``: its failure runs the cleanup step
    ``release``, then re-raises when the input says ``"reraise": true`` and returns
    ``{"charged": false, "error": ...}`` otherwise; on success ``receipt`` runs.
    ``--hang before-effect`` / ``after-effect`` hangs charge_card before or after its
    effect line.
``streamer``
    emits the words of ``before`` to the stream ``tokens``, then calls ``shout`` (whose
    step call emits its word in capitals), emits ``{"after": ...}``, then the words of
    ``after``. ``--hang mid-stream`` hangs the body before the words of ``after``.
``ledger``
    ``count`` steps (input ``{"count": n}``), each inserting one row into the table
    ``ledger`` in its own transaction, which records the step call's success with
    ``cyclone.step_call_record`` before it commits (needs --database-url). With
    ``--die-at STEP_ID:before-commit`` or ``STEP_ID:after-commit`` the process kills
    itself (SIGKILL) at that point of that call.

With --gated the worker starts claiming only when a line arrives on stdin, so a test
can start it early (Python takes a while to start) and let it loose when it is time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from pyclient import Worker, current, sleep, start_child, step, wait_for_event

LEDGER = "INSERT INTO ledger (run_id, node, step_id, pid) VALUES (%s, %s, %s, %s)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("effects_file")
    parser.add_argument(
        "--hang",
        choices=[
            "before-third",
            "before-effect",
            "after-effect",
            "before-wait",
            "after-wait",
            "after-start",
            "mid-stream",
        ],
    )
    parser.add_argument("--safe", action="store_true")
    parser.add_argument("--gated", action="store_true")
    parser.add_argument("--database-url")
    parser.add_argument("--die-at", default="")
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

    def hang_at(point: str, name: str) -> None:
        if args.hang == point:
            record(name, "paused", point)
            threading.Event().wait()  # until the test kills the process

    # One slot: while the body runs, no claim is outstanding that a kill could orphan.
    worker = Worker(
        args.address, database_url=args.database_url, concurrency=1, lease=2.0, claim_wait=5.0
    )

    # -- three_steps ------------------------------------------------------------------

    @step
    def first(n: int) -> int:
        record("first", detail=n)
        return n + 1

    @step
    def second(n: int) -> int:
        record("second", detail=n)
        return n * 10

    @step
    def third(n: int) -> int:
        record("third", detail=n)
        return n + 3

    @worker.workflow("three_steps")
    def three_steps(ctx, data: dict) -> dict:
        a = first(data["n"])
        b = second(a)
        hang_at("before-third", "three_steps")
        return {"a": a, "b": b, "c": third(b)}

    # -- napper -----------------------------------------------------------------------

    @worker.workflow("napper")
    def napper(ctx, data: dict) -> dict:
        a = first(data["n"])
        hang_at("before-wait", "napper")
        got = wait_for_event("go") if data.get("event") else sleep(data.get("sleep", 1))
        hang_at("after-wait", "napper")
        return {"a": a, "got": got, "c": third(a)}

    # -- counter ----------------------------------------------------------------------

    @worker.workflow("counter")
    def counter(ctx, data: dict) -> dict:
        state = {"total": 0}

        @ctx.update("add")
        def add(k: int) -> int:
            state["total"] += k
            record("add", "applied", k)
            return state["total"]

        @ctx.query("total")
        def total() -> int:
            return state["total"]

        a = first(data["n"])
        got = wait_for_event("go")
        hang_at("after-wait", "counter")
        return {"a": a, "got": got, "total": state["total"], "c": third(a)}

    # -- parent -----------------------------------------------------------------------

    @worker.workflow("kid")
    def kid(ctx, data: dict) -> dict:
        return {"double": data["n"] * 2}

    @worker.workflow("parent")
    def parent(ctx, data: dict) -> dict:
        a = first(data["n"])
        child = start_child(kid, {"n": a})
        hang_at("after-start", "parent")
        return {"child": child.run_id, "result": child.result()}

    # -- order ------------------------------------------------------------------------

    @step
    def reserve(order_id: str) -> str:
        record("reserve", detail=order_id)
        return f"res-{order_id}"

    def charge_card(order_id: str, amount: int) -> dict:
        record("charge_card", "entered", order_id)
        hang_at("before-effect", "charge_card")
        record("charge_card", detail=amount)
        hang_at("after-effect", "charge_card")
        return {"charge_id": f"ch-{os.getpid()}", "amount": amount}

    charge_card = step(unsafe_to_repeat=not args.safe)(charge_card)

    @step
    def release(reservation: str) -> None:
        record("release", detail=reservation)

    @step
    def receipt(charge: dict) -> str:
        record("receipt", detail=charge)
        return "sent"

    @worker.workflow("order")
    def order(ctx, data: dict) -> dict:
        reservation = reserve(data["order_id"])
        try:
            charge = charge_card(data["order_id"], data["amount"])
        except Exception as exc:
            release(reservation)
            if data.get("reraise"):
                raise
            error = {"type": getattr(exc, "type_name", type(exc).__name__), "message": str(exc)}
            return {"charged": False, "error": error}
        receipt(charge)
        return {"charged": True, "charge": charge}

    # -- streamer ---------------------------------------------------------------------

    @step
    def shout(word: str) -> str:
        current().emit("tokens", word.upper())  # a chunk of the step call "shout"
        record("shout", detail=word)
        return word.upper()

    @worker.workflow("streamer")
    def streamer(ctx, data: dict) -> str:
        for word in data["before"]:
            ctx.emit("tokens", word)
        loud = shout("loud")
        ctx.emit("tokens", {"after": loud})
        hang_at("mid-stream", "streamer")
        for word in data["after"]:
            ctx.emit("tokens", word)
        return loud

    # -- ledger -----------------------------------------------------------------------

    die_step, _, die_when = args.die_at.partition(":")

    def die_at(point: str) -> None:
        if current().step_id == die_step and die_when == point:
            os.kill(os.getpid(), signal.SIGKILL)

    @step
    def book(i: int) -> int:
        import psycopg

        ctx = current()
        record(ctx.step_id, "entered", i)
        with psycopg.connect(args.database_url) as conn:
            conn.execute(LEDGER, (ctx.run_id, ctx.node, ctx.step_id, os.getpid()))
            ctx.record_step_call(conn, i)
            die_at("before-commit")
        die_at("after-commit")
        return i

    @worker.workflow("ledger")
    def ledger(ctx, data: dict) -> list[int]:
        return [book(i) for i in range(data["count"])]

    if args.gated:
        sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
