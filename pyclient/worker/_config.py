"""What the parts of one worker run are given: the worker's settings, frozen when it
starts serving (:class:`WorkerConfig`), and the server as they call it (:class:`Server`).

Each part takes these and its other collaborators (a stopping event, the callbacks of
the parts it talks to) as explicit arguments; the package's ``__init__`` composes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from cyclone.v1 import worker_service_pb2 as pb
from pyclient.actions import Action
from pyclient.durable._calls import Limits

__all__ = ["Server", "WorkerConfig", "worker_limits"]

log = logging.getLogger("pyclient.worker")


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
    #: The payload limit results are checked against before they are sent, at most
    #: the server's (None: the server's).
    max_payload_bytes: int | None = None
    #: The most step calls a durable function's journal holds, at most the server's
    #: (None: the server's).
    max_step_calls: int | None = None
    #: The build of the worker's code ("": none), sent with every claim.
    build_id: str = ""
    #: On Citus, the node whose shards' runs the worker takes ("": any).
    shard_node: str = ""


@dataclass(frozen=True, slots=True)
class Server:
    """The server as the parts call it: the WorkerService stub on the run's channel and
    the metadata sent with every call (the bearer token)."""

    stub: Any
    metadata: tuple[tuple[str, str], ...]


def worker_limits(config: WorkerConfig, announced: pb.ServerLimits | None = None) -> Limits:
    """What the worker checks before it sends: the limits its server announced on the
    Work stream (the defaults until one did, or with an older server), lowered by the
    Worker's own settings, never raised by them. Says so in the log when a setting
    differs from the server's."""
    server = Limits()
    if announced is not None:
        told = {f.name: getattr(announced, f.name) for f in pb.ServerLimits.DESCRIPTOR.fields}
        server = Limits(
            max_payload_bytes=told["max_payload_bytes"] or server.max_payload_bytes,
            max_step_calls=told["max_step_calls"] or server.max_step_calls,
            max_error_text=told["max_error_text"] or server.max_error_text,
            max_name=told["max_step_call_name"] or server.max_name,
        )
    settings = {
        "max_payload_bytes": config.max_payload_bytes,
        "max_step_calls": config.max_step_calls,
    }
    kept = {f.name: getattr(server, f.name) for f in fields(Limits)}
    for name, setting in settings.items():
        if setting is None or setting == kept[name]:
            continue
        if announced is None or setting < kept[name]:
            if announced is not None:
                log.info(
                    "worker %s: %s=%d, lower than the server's %d: the worker keeps its own",
                    config.worker_id,
                    name,
                    setting,
                    kept[name],
                )
            kept[name] = setting
        else:
            log.warning(
                "worker %s: %s=%d is over the server's %d: the server's applies",
                config.worker_id,
                name,
                setting,
                kept[name],
            )
    return Limits(**kept)
