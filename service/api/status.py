"""The error-to-status boundary: :func:`status` turns whatever a servicer raised into
a gRPC status, and :func:`rpc` applies it to every RPC (CompleteMany applies it to
each refused item too). A workflow refused by the shared validator
(cyclone.dag.InvalidWorkflow) is INVALID_ARGUMENT here too, so servicers never
convert it themselves. (Calls the auth gate refuses, or whose bytes do not decode,
never reach a servicer: service.api.gate answers those itself.)"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from cyclone.codes import CURRENT_ATTEMPT_METADATA
from cyclone.dag import InvalidWorkflow
from service.api import auth
from service.errors import CycloneError, InvalidArgument, LeaseLost

log = logging.getLogger("service.errors")


#: Longest message a status carries. Messages quote input through cyclone.dag.excerpt;
#: this bound is the backstop that keeps any message within gRPC's metadata limit.
MAX_MESSAGE = 2000


def bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    return message[:MAX_MESSAGE] + f"... (cut: {len(message)} characters)"


@dataclass(frozen=True, slots=True)
class Status:
    """What a caller is answered: a status code, its message and trailing metadata."""

    code: grpc.StatusCode
    message: str
    metadata: tuple[tuple[str, str], ...] = ()


def status(exc: Exception, where: str) -> Status:
    """The gRPC status for an exception raised while serving ``where`` (an RPC name).

    Domain errors keep their message (with the detail for an admin caller); anything
    unexpected becomes INTERNAL with an error id, logged with the traceback, so that no
    internal detail reaches the caller.
    """
    if isinstance(exc, InvalidWorkflow):
        exc = InvalidArgument(str(exc))
    if not isinstance(exc, CycloneError):
        error_id = uuid.uuid4().hex[:12]
        log.error("internal error %s in %s", error_id, where, exc_info=exc)
        return Status(
            grpc.StatusCode.INTERNAL, f"internal error (id {error_id}); see the server log"
        )
    message = str(exc)
    if exc.detail:
        log.warning("%s: %s", where, exc.detail)
        identity = auth.caller.get()
        if identity is not None and identity.role == "admin":
            message = f"{message} ({exc.detail})"
    metadata: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, LeaseLost) and exc.current_attempt is not None:
        metadata = ((CURRENT_ATTEMPT_METADATA, str(exc.current_attempt)),)
    return Status(exc.kind.code, bounded(message), metadata)


Request = TypeVar("Request")
Response = TypeVar("Response")
Servicer = TypeVar("Servicer")


def rpc(
    method: Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]],
) -> Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]:
    """Answer whatever a servicer method raises with its :func:`status`."""

    @functools.wraps(method)
    async def wrapper(
        self: Servicer, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, method.__name__)
            raise  # abort raises; this line is never reached

    return wrapper


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: Exception, where: str) -> None:
    """End the call with the status that answers ``exc`` (abort raises AbortError)."""
    answer = status(exc, where)
    if answer.metadata:
        context.set_trailing_metadata(answer.metadata)
    await context.abort(answer.code, answer.message)


def stream_rpc(
    method: Callable[
        [Servicer, Request, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Response]
    ],
) -> Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Response]]:
    """:func:`rpc` for a servicer method that answers with a stream (an async
    generator): whatever it raises ends the stream with its :func:`status`."""

    @functools.wraps(method)
    async def wrapper(
        self: Servicer, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Response]:
        try:
            async for response in method(self, request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, method.__name__)

    return wrapper
