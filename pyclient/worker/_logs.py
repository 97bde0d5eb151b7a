"""Step logs: what a handler logs through :mod:`logging` travels to the server with the
step's next heartbeat or its completion (HeartbeatRequest.logs, CompleteRequest.logs),
where it is kept per attempt (docs/python-sdk.md, "Step logs").

While a worker runs, one handler on the root logger looks at every record: a record made
where a handler's context is current (the handler's own thread or task, and whatever it
runs with that context: ``asyncio.to_thread``, ``contextvars.copy_context().run``) joins
that step's lines; any other record is left alone. Lines wait in memory, at most
MAX_LINES per attempt (the server keeps no more), until a heartbeat or the completion
takes them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from cyclone.v1 import types_pb2
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.context import StepControl, active
from pyclient.errors import from_rpc_error
from pyclient.worker._common import RPC_TIMEOUT, StepLog, no_nul

if TYPE_CHECKING:
    from pyclient.worker._config import Server

#: Lines an attempt may send: the server keeps 1000 and marks the rest as dropped, so
#: one more line than that is enough for it to say so.
MAX_LINES = 1001
#: The server cuts a line here; nothing longer is worth sending.
MAX_MESSAGE = 4096


class StepLines:
    """The lines of one running step not sent yet."""

    def __init__(self) -> None:
        self._lines: list[types_pb2.LogLine] = []
        self._count = 0
        self._lock = threading.Lock()

    def add(self, record: logging.LogRecord, text: str) -> None:
        line = types_pb2.LogLine(
            level=no_nul(record.levelname)[:16],
            message=no_nul(text)[:MAX_MESSAGE],
            logger=no_nul(record.name)[:200],
        )
        line.at.FromNanoseconds(int(record.created * 1e9))
        with self._lock:
            if self._count < MAX_LINES:
                self._count += 1
                self._lines.append(line)

    def pending(self) -> bool:
        """Lines are waiting (a read without the lock: the handler that logs them has
        returned when its outcome asks)."""
        return bool(self._lines)

    def take(self) -> list[types_pb2.LogLine]:
        with self._lock:
            lines, self._lines = self._lines, []
            return lines

    def give_back(self, lines: list[types_pb2.LogLine]) -> None:
        """Lines a heartbeat could not deliver: they go with the next one."""
        with self._lock:
            self._lines[:0] = lines


#: Held while a step's lines are made (once for each step that logs).
_making = threading.Lock()


def lines_of(control: StepControl) -> StepLines:
    """The lines of the step that ``control`` runs (made the first time)."""
    lines: StepLines | None = control.log_lines
    if lines is None:
        with _making:
            lines = control.log_lines
            if lines is None:
                lines = control.log_lines = StepLines()
    return lines


def take(control: StepControl) -> list[types_pb2.LogLine]:
    """The step's lines not sent yet, to send now."""
    lines: StepLines | None = control.log_lines
    return lines.take() if lines is not None else []


async def send_by_heartbeat(
    server: Server, beat: pb.HeartbeatRequest, request: pb.CompleteRequest, slog: StepLog
) -> None:
    """A completion committed in the handler's own transaction (ctx.completion_tx())
    cannot carry lines: the request's go with ``beat``, one last heartbeat of its step,
    under the lease."""
    if not request.logs:
        return
    beat.logs.extend(request.logs)
    del request.logs[:]
    try:
        await server.stub.Heartbeat(beat, timeout=RPC_TIMEOUT, metadata=server.metadata)
    except grpc.RpcError as exc:
        slog.warning("log lines not sent: %s", from_rpc_error(exc))


_traceback = logging.Formatter()


class _Capture(logging.Handler):
    """Hands each record made in a handler's context to that step's lines."""

    def emit(self, record: logging.LogRecord) -> None:
        ctx = active()
        if ctx is None:
            return
        try:
            text = record.getMessage()
            if record.exc_info:
                text = f"{text}\n{_traceback.formatException(record.exc_info)}"
        except Exception:
            self.handleError(record)
            return
        lines_of(ctx._control).add(record, text)


_installed = 0
_capture = _Capture()
_install_lock = threading.Lock()


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Capture handlers' records while a worker runs (several workers share one)."""
    global _installed
    with _install_lock:
        if _installed == 0:
            logging.getLogger().addHandler(_capture)
        _installed += 1
    try:
        yield
    finally:
        with _install_lock:
            _installed -= 1
            if _installed == 0:
                logging.getLogger().removeHandler(_capture)
