"""What the parts of one worker run are given: the worker's settings, frozen when it
starts serving (:class:`WorkerConfig`), and the server as they call it (:class:`Server`).

Each part takes these and its other collaborators (a stopping event, the callbacks of
the parts it talks to) as explicit arguments; the package's ``__init__`` composes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyclient.actions import Action
from pyclient.durable._calls import MAX_PAYLOAD_BYTES, MAX_STEP_CALLS

__all__ = ["Server", "WorkerConfig"]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A worker's settings as one run of it serves them (see :class:`~pyclient.Worker`)."""

    worker_id: str
    address: str
    #: The actions served, by name.
    actions: Mapping[str, Action]
    concurrency: int
    lease: float
    claim_wait: float
    shutdown_grace: float
    reconnect_max_delay: float
    database_url: str | None = None
    #: The server's payload limit, checked before a result is sent.
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    #: The most step calls a durable function's journal holds.
    max_step_calls: int = MAX_STEP_CALLS
    #: The build of the worker's code ("": none), sent with every claim.
    build_id: str = ""


@dataclass(frozen=True, slots=True)
class Server:
    """The server as the parts call it: the WorkerService stub on the run's channel and
    the metadata sent with every call (the bearer token)."""

    stub: Any
    metadata: tuple[tuple[str, str], ...]
