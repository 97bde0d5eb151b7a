"""Domain errors: what every wing raises, and their one translation into gRPC
statuses, at the edges.

Errors are translated at two boundaries only:

- on the way in, in service.db.pool: a database error (an engine SQLSTATE, a lost
  connection, a timeout) becomes one of these classes, and so does an engine refusal
  of one item of a CompleteMany batch (a typed result, service.db.records.Refused);
- on the way out, in service.api.status: whatever a servicer raised becomes a gRPC
  status.

Each class's docstring is its default message; its kind (cyclone.codes) names its
status code.
"""

from __future__ import annotations

from typing import ClassVar

from cyclone.codes import ErrorKind


class CycloneError(Exception):
    """Cyclone could not do that."""

    kind: ClassVar[ErrorKind] = ErrorKind.INTERNAL

    def __init__(self, message: str | None = None, *, detail: str | None = None) -> None:
        super().__init__(message or self.__doc__)
        #: What only the server log and admins see (e.g. the database's address).
        self.detail = detail


class InvalidArgument(CycloneError):
    """The request is invalid."""

    kind = ErrorKind.INVALID_ARGUMENT


class NotFound(CycloneError):
    """No such run or node."""

    kind = ErrorKind.NOT_FOUND


class AlreadyExists(CycloneError):
    """Something by that name exists already."""

    kind = ErrorKind.ALREADY_EXISTS


class FailedPrecondition(CycloneError):
    """The current state does not allow this transition."""

    kind = ErrorKind.FAILED_PRECONDITION


class LeaseLost(CycloneError):
    """The lease is no longer held: it expired or another attempt took the step."""

    kind = ErrorKind.LEASE_LOST

    def __init__(
        self,
        message: str | None = None,
        *,
        current_attempt: int | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, detail=detail)
        #: The attempt that holds the step now, when the engine said.
        self.current_attempt = current_attempt


class ResourceExhausted(CycloneError):
    """A limit was exceeded."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class Unavailable(CycloneError):
    """The database is unavailable; try again."""

    kind = ErrorKind.UNAVAILABLE


class DeadlineExceeded(CycloneError):
    """It did not happen in time."""

    kind = ErrorKind.DEADLINE_EXCEEDED


_BY_KIND: dict[ErrorKind, type[CycloneError]] = {
    cls.kind: cls
    for cls in (InvalidArgument, NotFound, FailedPrecondition, ResourceExhausted, Unavailable)
}


def of_kind(kind: ErrorKind | None, message: str, *, detail: str | None = None) -> CycloneError:
    """The domain error of a kind of error (None: an unexpected one, INTERNAL)."""
    if kind is None:
        return CycloneError(message, detail=detail)
    return _BY_KIND.get(kind, CycloneError)(message, detail=detail)
