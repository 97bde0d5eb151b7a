"""Waits the server serves itself: DAG nodes that wait for an event (Node.event).

Such a node needs no worker. At submit it gets the reserved action ``cyclone.event``
and its event's name and timeout as its input (:func:`event_node_input`). Each server
runs one :class:`EventNodes` loop that claims steps of that action as a worker would
(no user worker can: Claim refuses actions starting with ``cyclone.``) and asks the
engine's ``step_wait`` for the event, exactly as a durable function's Wait does:

- the event is there (sent before or since): the node completes with its payload;
- the timeout has passed: the node is discarded with ``EventTimeout`` (no retry), so
  that ONE_FAILED compensation below it runs;
- otherwise the node is suspended: available again at its timeout, or at once when
  SendEvent sends that event (SendEvent notifies ``cyclone.event``, which wakes this
  loop on whichever server hears it first; the claim's SKIP LOCKED lets one take it).

Why a claiming loop rather than completing the node inside SendEvent: the timeout
needs something that acts when nothing is sent, and a claim of a reserved action
reuses the engine as it is (leases, the sweep after a server dies mid-way, resumes
that use up no attempt, the journal that shows the wait), at the cost of one idle
loop per server that sleeps until the next notification or timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from typing import Any

from cyclone import dag
from service import errors
from service.config import Settings
from service.db import Database
from service.db.records import ClaimedStep, Failure, Outcome
from service.db.waits import WaitKey
from service.engine.notify import Dispatcher

log = logging.getLogger("cyclone")

#: Actions served by the server itself; Submit and Claim refuse them from users.
RESERVED_PREFIX = "cyclone."
#: The action of a DAG node that waits for an event.
EVENT_ACTION = "cyclone.event"
#: The step id of that wait in the node's journal.
EVENT_STEP_ID = "event"
#: Longest event timeout.
MAX_EVENT_TIMEOUT_S = 366 * 86400.0
#: Most event nodes claimed at once.
BATCH = 100


def event_wait(name: str, timeout_s: float | None, what: str) -> tuple[str, float | None]:
    """An event wait's name and timeout, validated (INVALID_ARGUMENT names ``what``)."""
    if not name or len(name) > 200 or not name.isprintable():
        raise errors.InvalidArgument(
            f"{what}: an event name must be 1 to 200 printable characters, got {dag.excerpt(name)}"
        )
    if timeout_s is not None and not 0.001 <= timeout_s <= MAX_EVENT_TIMEOUT_S:
        raise errors.InvalidArgument(
            f"{what}: an event timeout must be between 1ms and 366 days, got {timeout_s:g}s"
        )
    return name, timeout_s


def event_node_input(name: str, timeout_s: float | None, what: str) -> dict[str, Any]:
    """The stored input of a DAG node that waits for an event."""
    try:
        name, timeout_s = event_wait(name, timeout_s, what)
    except errors.InvalidArgument as exc:
        raise dag.InvalidWorkflow(str(exc)) from None
    return {"event": name, "timeout_s": timeout_s}


class EventNodes:
    """The loop of one server that serves DAG nodes waiting for an event."""

    def __init__(self, db: Database, dispatcher: Dispatcher, settings: Settings) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.settings = settings
        self.worker_id = f"cyclone-server:{socket.gethostname()}:{os.getpid()}"

    async def run(self) -> None:
        """Until cancelled: claim what is due, serve it, sleep until notified or due."""
        while True:
            with self.dispatcher.subscribe([EVENT_ACTION]) as ready:
                claimed_at = time.monotonic()
                try:
                    rows = await self.db.steps.step_claim(
                        worker_id=self.worker_id,
                        actions=[EVENT_ACTION],
                        unsafe=[],
                        limit=BATCH,
                        lease_s=self.settings.lease_s,
                    )
                    for row in rows:
                        await self.serve(row)
                    if len(rows) == BATCH:
                        continue
                    due = await self.db.steps.step_next_due(
                        [EVENT_ACTION], time.monotonic() - claimed_at
                    )
                except errors.CycloneError as exc:
                    log.warning("event nodes: %s", exc)
                    due = None
                except Exception:
                    log.exception("event nodes failed")
                    due = None
                recheck = self.settings.claim_recheck_s
                timeout = recheck if due is None else min(recheck, max(due, 0.001))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await ready.wait()

    async def serve(self, row: ClaimedStep) -> None:
        """One claimed event node: completed, discarded on timeout, or suspended."""
        spec = row.input if isinstance(row.input, dict) else {}
        key = WaitKey(
            row.run_id,
            row.node,
            row.lease_token,
            EVENT_STEP_ID,
            1,
            "cyclone.event",
            event=str(spec.get("event") or ""),
            timeout_s=spec.get("timeout_s"),
        )
        extra = {"run_id": str(row.run_id), "node": row.node, "attempt": row.attempt}
        try:
            waited = await self.db.waits.step_wait(key)
        except errors.LeaseLost:
            return  # cancelled meanwhile
        if waited.decision == "suspended":
            return
        call = waited.call
        if call["status"] == "succeeded":
            outcome = Outcome(
                row.run_id,
                row.node,
                row.lease_token,
                output_json=json.dumps(call["output"], separators=(",", ":")),
            )
            log.info("event node %s/%s got event %s", row.run_id, row.node, key.event, extra=extra)
        else:
            error = call["error"] or {"type": "EventTimeout", "message": "", "details": ""}
            outcome = Outcome(
                row.run_id,
                row.node,
                row.lease_token,
                failure=Failure(
                    type=error["type"],
                    message=error["message"],
                    details="",
                    retryable=False,
                    retry_after_s=None,
                    uncertain=False,
                ),
            )
            log.warning(
                "event node %s/%s timed out: %s",
                row.run_id,
                row.node,
                error["message"],
                extra=extra,
            )
        with contextlib.suppress(errors.LeaseLost):
            await self.db.reports.step_complete(outcome)
