"""The engine's error codes, and the kind of error each one means.

The SQL functions of the engine refuse a transition by raising one of the custom
SQLSTATEs below (docs/exactly-once.md lists them for workers in any language). The
server (service.db.pool) reads them through :data:`SQLSTATE_KINDS`, the SDK's
completion transaction (pyclient.completion) through its engine part,
:data:`ENGINE_SQLSTATES`; each side raises its own exception for the kind, and the
server answers with the kind's gRPC status code.
"""

from __future__ import annotations

import enum

import grpc

__all__ = [
    "ALREADY_COMPLETED",
    "CURRENT_ATTEMPT_METADATA",
    "ENGINE_SQLSTATES",
    "FORBIDDEN_TRANSITION",
    "INVALID_INPUT",
    "INVALID_WORKFLOW",
    "LEASE_LOST",
    "SQLSTATE_KINDS",
    "UNKNOWN_STEP",
    "ErrorKind",
    "current_attempt",
]

#: The lease is not held (expired, another attempt holds the step, the run ended).
#: Its DETAIL reads ``current_attempt=N``.
LEASE_LOST = "CY001"
#: No such run or node.
UNKNOWN_STEP = "CY002"
#: The current state forbids the transition (e.g. resolving a run that is not blocked).
FORBIDDEN_TRANSITION = "CY003"
#: An argument the function refuses (e.g. an unknown resolution).
INVALID_INPUT = "CY004"
#: cyclone.submit refused the workflow or another of its arguments (docs/submit-from-sql.md).
INVALID_WORKFLOW = "CY006"
#: cyclone.step_complete with the token that already completed the step: a repeat.
ALREADY_COMPLETED = "CY005"


class ErrorKind(enum.Enum):
    """What went wrong, whoever reports it; the value is the gRPC status code."""

    INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
    NOT_FOUND = grpc.StatusCode.NOT_FOUND
    ALREADY_EXISTS = grpc.StatusCode.ALREADY_EXISTS
    FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
    LEASE_LOST = grpc.StatusCode.ABORTED
    RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
    UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
    DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED
    INTERNAL = grpc.StatusCode.INTERNAL

    @property
    def code(self) -> grpc.StatusCode:
        return self.value


#: The engine's own refusals (CY005 is not one: a repeat is answered, not refused).
ENGINE_SQLSTATES: dict[str, ErrorKind] = {
    LEASE_LOST: ErrorKind.LEASE_LOST,
    UNKNOWN_STEP: ErrorKind.NOT_FOUND,
    FORBIDDEN_TRANSITION: ErrorKind.FAILED_PRECONDITION,
    INVALID_INPUT: ErrorKind.INVALID_ARGUMENT,
    INVALID_WORKFLOW: ErrorKind.INVALID_ARGUMENT,
}

#: Every SQLSTATE with a meaning to Cyclone: the engine's, and Postgres' own that say
#: the input was bad or the database is unavailable.
SQLSTATE_KINDS: dict[str, ErrorKind] = {
    **ENGINE_SQLSTATES,
    "22P02": ErrorKind.INVALID_ARGUMENT,  # invalid text representation (e.g. a bad UUID)
    "22001": ErrorKind.INVALID_ARGUMENT,  # string too long
    "54001": ErrorKind.INVALID_ARGUMENT,  # statement too complex
    "54000": ErrorKind.RESOURCE_EXHAUSTED,  # a bound of the server's (a run's streams)
    "57014": ErrorKind.UNAVAILABLE,  # statement timeout
    "08006": ErrorKind.UNAVAILABLE,  # connection failure
    "08001": ErrorKind.UNAVAILABLE,  # cannot connect
    "57P01": ErrorKind.UNAVAILABLE,  # admin shutdown
    "57P03": ErrorKind.UNAVAILABLE,  # cannot connect now
}

#: The trailer of an ABORTED answer that names the attempt now holding the step.
CURRENT_ATTEMPT_METADATA = "cyclone-current-attempt"

_CURRENT_ATTEMPT = "current_attempt="


def current_attempt(detail: str | None) -> int | None:
    """The attempt named by a CY001's DETAIL (``current_attempt=N``), else None."""
    if not detail or not detail.startswith(_CURRENT_ATTEMPT):
        return None
    try:
        return int(detail.removeprefix(_CURRENT_ATTEMPT))
    except ValueError:
        return None
