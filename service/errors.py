"""Domain errors, and their translation to gRPC status codes.

Errors are translated at two boundaries only: database errors into these classes in
service.store, and these classes into gRPC statuses by :func:`rpc` here. Each class's
docstring is its default message.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from service import auth

log = logging.getLogger(__name__)


class CycloneError(Exception):
    """Cyclone could not do that."""

    code = grpc.StatusCode.INTERNAL

    def __init__(
        self, message: str | None = None, *, metadata: tuple = (), detail: str | None = None
    ) -> None:
        super().__init__(message or self.__doc__)
        self.metadata = metadata
        #: What only the server log and admins see (e.g. the database's address).
        self.detail = detail


class InvalidArgument(CycloneError):
    """The request is invalid."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CycloneError):
    """No such run or node."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(CycloneError):
    """The current state does not allow this transition."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class LeaseLost(CycloneError):
    """The lease is no longer held: it expired or another attempt took the step."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(CycloneError):
    """A limit was exceeded."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(CycloneError):
    """The database is unavailable; try again."""

    code = grpc.StatusCode.UNAVAILABLE


#: Longest message a status carries. Messages quote input through pyclient.dag.excerpt;
#: this bound is the backstop that keeps any message within gRPC's metadata limit.
MAX_MESSAGE = 2000


def bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    return message[:MAX_MESSAGE] + f"... (cut: {len(message)} characters)"


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def rpc(method: F) -> F:
    """Turn domain errors raised by a servicer method into gRPC statuses.

    Anything unexpected becomes INTERNAL with an error id, logged with the traceback,
    so that no internal detail reaches the caller.
    """

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except CycloneError as exc:
            if exc.metadata:
                context.set_trailing_metadata(exc.metadata)
            message = str(exc)
            if exc.detail:
                log.warning("%s: %s", method.__name__, exc.detail)
                identity = auth.caller.get()
                if identity is not None and identity.role == "admin":
                    message = f"{message} ({exc.detail})"
            await context.abort(exc.code, bounded(message))
        except grpc.aio.AbortError:
            raise
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("internal error %s in %s", error_id, method.__name__)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal error (id {error_id}); see the server log"
            )

    return wrapper  # type: ignore[return-value]
