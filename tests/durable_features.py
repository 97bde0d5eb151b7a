"""A worker whose steps, failure class and durable function live at the top of this
file, for tests/test_durable_processes.py: started as a script (module ``__main__``),
then as an imported module, to show that both replay the same journal.

    python tests/durable_features.py ADDRESS EFFECTS_FILE [--hang] [--gated]
    python -c "from tests import durable_features; durable_features.main()" ADDRESS ...

``features`` calls ``lookup``, then ``pay``, which raises :class:`Declined`; the body
catches it and appends what it saw (phase "caught") to EFFECTS_FILE; ``--hang`` stops
the body there (phase "paused"), to be killed; then ``finish`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from pyclient import StepFailed, Worker, current, step

EFFECTS = ""


def write(phase: str, detail: object = None) -> None:
    """Append a line to the effects file, synced to disk before going on."""
    ctx = current()
    line = {"run_id": ctx.run_id, "attempt": ctx.attempt, "phase": phase, "detail": detail}
    line["pid"] = os.getpid()
    with open(EFFECTS, "a") as effects:
        effects.write(json.dumps(line) + "\n")
        effects.flush()
        os.fsync(effects.fileno())


class Declined(Exception):
    """A failure with attributes, whose class belongs to this file."""

    def __init__(self, code: str, amount: int):
        super().__init__(f"declined: {code}")
        self.code = code
        self.amount = amount


@step
def lookup(key: str) -> str:
    write("lookup", key)
    return key.upper()


@step
def pay(amount: int) -> None:
    write("pay", amount)
    raise Declined("insufficient_funds", amount)


@step
def finish(what: str) -> str:
    write("finish", what)
    return f"done {what}"


def features(ctx, data: dict, *, hang: bool) -> dict:
    key = lookup(data["key"])
    try:
        pay(data["amount"])
    except StepFailed as e:
        cause = e.exception
        write(
            "caught",
            {
                "type": e.type,
                "type_name": e.type_name,
                "message": e.message,
                "attributes": e.attributes,
                "args": e.error_args,
                "class": type(cause).__name__,
                "is_declined": isinstance(cause, Declined),
                "code": getattr(cause, "code", None),
                "module": __name__,
            },
        )
    if hang:
        write("paused")
        threading.Event().wait()  # until the test kills the process
    return {"key": key, "end": finish(key)}


def main() -> None:
    global EFFECTS
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("effects_file")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--gated", action="store_true")
    args = parser.parse_args()
    EFFECTS = args.effects_file
    worker = Worker(args.address, concurrency=1, lease=2.0, claim_wait=5.0)
    worker.workflow("features")(lambda ctx, data: features(ctx, data, hang=args.hang))
    if args.gated:
        sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
