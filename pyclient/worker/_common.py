"""What every part of the worker shares: its logger, the per-step log prefix, the
handler's outcome, and the one exception the worker adds to a handler's own."""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

#: Every part of the worker logs here (docs/python-sdk.md names it).
log = logging.getLogger("pyclient.worker")

#: Deadline of heartbeat-free calls (Complete, CompleteMany, the last progress).
RPC_TIMEOUT = 10.0


class Ending(Protocol):
    """Where a handler's outcome goes, on the worker's loop: its step (one call of
    either method, whichever comes first, counts; ``ended`` says one did)."""

    ended: bool

    def settle(self, value: Any, error: BaseException | None) -> None:
        """The handler returned ``value`` or raised ``error``."""

    def drop(self) -> None:
        """The handler was cancelled, or its outcome is given up on."""


class HandlerTimeout(Exception):
    """The handler ran past its timeout and was cancelled."""

    # Its public home, as tracebacks (a failure's details) name it.
    __module__ = "pyclient.worker"


class StepLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with run, node and attempt, and adds them as extras.
    ``step`` is anything with those three attributes (a ClaimedStep); they are read
    only when a message is logged (most steps log none)."""

    def __init__(self, logger: logging.Logger, step: Any):
        # What LoggerAdapter.__init__ sets, without its call (one adapter per step).
        self.logger = logger
        self.extra = None
        self.merge_extra = False  # (read by LoggerAdapter.process from 3.13, not ours)
        self.step = step

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        step = self.step
        e = {"run_id": step.run_id, "node": step.node, "attempt": step.attempt}
        kwargs["extra"] = {**e, **kwargs.get("extra", {})}
        return f"run={e['run_id']} node={e['node']} attempt={e['attempt']}: {msg}", kwargs


def log_blocked(worker_id: str, blocked: Any) -> None:
    """A run this worker's claim blocked (ClaimResponse.blocked): a warning, since a
    blocked run waits for a person, not an error."""
    target = blocked.step_id or blocked.node
    log.warning(
        "worker %s: run %s blocked: node %s%s (action %s), attempt %d: %s",
        worker_id,
        blocked.run_id,
        blocked.node,
        f", step call {blocked.step_id}" if blocked.step_id else "",
        blocked.action,
        blocked.attempt,
        blocked.reason
        or f"unsafe to repeat; resolve it with `cyclone resolve {blocked.run_id} {target}`",
        extra={"run_id": blocked.run_id, "node": blocked.node, "attempt": blocked.attempt},
    )


def no_nul(text: str) -> str:
    """``text`` with each NUL character written as the two characters ``\\0``: the
    server refuses NUL in any text it stores (Postgres cannot hold it)."""
    return text.replace("\x00", "\\0") if "\x00" in text else text


def call(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)``, logging a failure: it must not keep the calls after it from being made."""
    try:
        fn(*args)
    except Exception:
        log.exception("%r failed", fn)
