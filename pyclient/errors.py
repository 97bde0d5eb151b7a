"""The SDK's exceptions, and where errors from outside become them.

Every error the SDK raises derives from :class:`CycloneError`. Errors that come from
the server keep the server's message and its status code; :func:`from_rpc_error` is
the only translation of a gRPC error, applied where a call leaves the SDK, and
:func:`error_for_kind` the only one of an engine SQLSTATE (cyclone.codes), applied by
the completion transaction.

Handlers raise two more exceptions, outside that hierarchy because they are not
errors of Cyclone but instructions to it: :class:`NonRetryableError` and
:class:`RetryAfter`.
"""

from __future__ import annotations

import grpc

from cyclone.codes import ErrorKind


class CycloneError(Exception):
    """Cyclone call failed."""

    #: The gRPC status code the server answered with, when the error came from it.
    code: grpc.StatusCode | None = None

    def __init__(self, message: str | None = None, *, code: grpc.StatusCode | None = None):
        self.message = message or self.__doc__ or ""
        if code is not None:
            self.code = code
        super().__init__(self.message)


class InvalidArgument(CycloneError, ValueError):
    """Invalid argument."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CycloneError, LookupError):
    """No such run or node."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(CycloneError):
    """The current state of the run forbids this transition."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class LeaseLost(CycloneError):
    """The lease on this step was lost: another attempt holds it, or the run ended."""

    code = grpc.StatusCode.ABORTED


class Unavailable(CycloneError, ConnectionError):
    """The Cyclone server is unavailable."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(Unavailable, TimeoutError):
    """The call to the Cyclone server timed out."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(CycloneError):
    """Missing or invalid credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(CycloneError):
    """The caller may not do this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class WaitTimeout(CycloneError, TimeoutError):
    """The run did not finish in time."""


class OutsideHandler(CycloneError, RuntimeError):
    """No step is running here: the handler context exists only inside a handler."""


_BY_CODE: dict[grpc.StatusCode, type[CycloneError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        LeaseLost,
        Unavailable,
        DeadlineExceeded,
        Unauthenticated,
        PermissionDenied,
    )
    if cls.code is not None
}


def from_rpc_error(exc: grpc.RpcError) -> CycloneError:
    """The SDK exception for a failed gRPC call, with the server's message and code."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else None
    cls = _BY_CODE.get(code, CycloneError) if code is not None else CycloneError
    if cls is CycloneError and code is not None:
        details = f"{code.name}: {details or cls.__doc__}"
    error = cls(details or None, code=code)
    error.__cause__ = exc
    return error


def error_for_kind(kind: ErrorKind, message: str) -> CycloneError:
    """The SDK exception for a kind of error (as the engine's SQLSTATEs name them)."""
    return _BY_CODE.get(kind.code, CycloneError)(message or None, code=kind.code)


def error_for_code(code: int, message: str) -> CycloneError:
    """The SDK exception for a gRPC status code number (as CompleteMany reports them)."""
    status = next((c for c in grpc.StatusCode if c.value[0] == code), None)
    cls = _BY_CODE.get(status, CycloneError) if status is not None else CycloneError
    return cls(message or None, code=status)


class NonRetryableError(Exception):
    """Raised by a handler: the step failed for good, do not retry it.

    The step is discarded at once, whatever attempts remain; nodes downstream are
    skipped unless their trigger rule runs them on failure. Subclass it to report
    your own error type.
    """


class StepResultTooLarge(CycloneError):
    """A step call returned a value larger than the journal keeps (the server's
    payload limit). The call is recorded failed with this error, so the body sees it
    (as the ``exception`` of the StepFailed the call raises) on every replay too."""

    def __init__(self, message: str | None = None, *, code: grpc.StatusCode | None = None):
        super().__init__(message, code=code)


class OutputTooLarge(CycloneError, NonRetryableError):
    """A handler (or a durable function's body) returned a value larger than the
    server's payload limit: the node fails for good with this error."""


class OutputNotJson(CycloneError, NonRetryableError):
    """A handler (or a durable function's body) returned a value JSON cannot carry (a
    set, bytes, NaN, an object of a class of yours): the node fails for good with this
    error, which names the cause. The same code would return the same value again."""


class JournalFull(CycloneError, NonRetryableError):
    """A durable function made more step calls than its node's journal holds: the node
    fails for good with this error."""


class StreamFull(CycloneError, NonRetryableError):
    """``ctx.emit`` was refused: the run's output streams hold as many bytes or chunks as
    the server allows (--max-stream-bytes-per-run, --max-stream-chunks-per-run), or the
    chunk is larger than one may be (--max-stream-chunk-bytes). Nothing of that emit
    was stored. Uncaught, it fails the node for good: its retries would be refused too."""


class RetryAfter(Exception):
    """Raised by a handler: the step failed, retry it no sooner than ``seconds`` from now.

    This replaces the node's backoff for this failure; the attempt still counts.
    """

    def __init__(self, seconds: float, message: str = ""):
        if seconds < 0:
            raise ValueError(f"RetryAfter needs seconds >= 0, got {seconds}")
        super().__init__(message or f"retry after {seconds:g}s")
        self.seconds = seconds
