"""How the replay engine names step calls to a journal, and the protocol of a journal
backend (:class:`JournalBackend`): the worker's sends Begin and End to the server, the one
of pyclient.testing keeps the journal in memory."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf import struct_pb2

from cyclone.v1 import types_pb2
from pyclient.models import StepCall, StepCallError

#: Longest step id, function name and error type the server accepts.
MAX_ID = 200

#: The server's default payload limit (``--max-payload-bytes``): the largest step call
#: result or handler output it takes, in bytes of its protobuf Value. See "Limits" in
#: docs/operations.md.
MAX_PAYLOAD_BYTES = 1 << 20

#: The most step calls a node's journal holds (the engine's limit).
MAX_STEP_CALLS = 10_000

#: The longest error message or details the server takes, in characters.
MAX_ERROR_TEXT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a durable function's step calls are checked against before they are
    sent: the server's payload limit, the journal's size, the longest error text and
    error type. A worker adopts those its server announces (WorkResponse.limits)."""

    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    max_step_calls: int = MAX_STEP_CALLS
    max_error_text: int = MAX_ERROR_TEXT
    max_name: int = MAX_ID


@dataclass(frozen=True, slots=True)
class WaitFn:
    """What the journal knows of a wait, as of a step function: the base of its step
    ids and its function (cyclone.sleep, cyclone.event, cyclone.child)."""

    name: str
    function: str
    is_async: bool = False
    unsafe_to_repeat: bool = False


class WaitDecision(enum.Enum):
    """What Wait answers."""

    READY = "ready"
    SUSPENDED = "suspended"


@dataclass(frozen=True, slots=True)
class Until:
    """What a wait waits for: exactly one of a wake time (a sleep), an event (with an
    optional timeout in seconds) or a child run."""

    wake_at: Any = None
    event: str | None = None
    timeout: float | None = None
    child_run_id: str | None = None


class Decision(enum.Enum):
    """What Begin answers for an unsafe call."""

    RUN = "run"
    RECORDED = "recorded"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True, slots=True)
class Call:
    """One step call as the journal names it."""

    step_id: str
    seq: int
    function: str
    unsafe: bool
    #: Another recorded function that names the same call (an older form of it).
    legacy_function: str | None = None
    #: The module of the step function (where a recorded exception's class is looked
    #: for when the journal names the script's, ``__main__``).
    module: str | None = None
    #: The digest of the call's arguments (pyclient.durable._digest), "" for none.
    args_digest: str = ""
    #: ``@step(record="async")``: the body's next step call does not wait for this
    #: call's record (it may run again after a crash even once the body moved past it).
    record_async: bool = False

    def records(self, recorded: str) -> bool:
        """Whether a journal entry recorded for ``recorded`` is a call of this
        function: the same name, or the older ``module.name`` form of it."""
        return (
            recorded == self.function
            or recorded.endswith("." + self.function)
            or (self.legacy_function is not None and recorded == self.legacy_function)
        )


#: A call's outcome as recorded: its JSON output, or its error.
Outcome = struct_pb2.Value | StepCallError


class CallSpec(Protocol):
    """What names a call's function for the journal: a StepFunction, or a WaitFn (the
    SDK's own calls: a wait, a child's start)."""

    @property
    def name(self) -> str: ...

    @property
    def function(self) -> str: ...

    @property
    def unsafe_to_repeat(self) -> bool: ...

    @property
    def is_async(self) -> bool: ...


class StepSpec(CallSpec, Protocol):
    """A step function as the replay engine runs it: its names, and the function."""

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def runner(self) -> Callable[..., Any]:
        """What runs one try of the call: ``fn``, or ``fn`` under its timeout."""

    @property
    def on_args_change(self) -> str:
        """``"fail"`` or ``"allow"``: what a replay does when the arguments of a
        recorded call changed."""


class CallTx(Protocol):
    """A step call's own transaction (``ctx.completion_tx()`` inside a step call): its
    commit records the call's success with the writes made on it."""

    def connection(self) -> Any: ...

    def commit(self, output_json: str) -> None: ...

    def rollback(self) -> None: ...


class JournalBackend(Protocol):
    """Where a node's journal is written. Sync methods are called from sync step
    calls (a body's thread), async ones from async step calls (a body's event loop).

    A backend raises LeaseLost when the node is no longer this attempt's, BodyStopped
    when the body must stop for another reason, other CycloneErrors when the journal
    refuses a write (the node then fails with it)."""

    def before_run(self, call: Call) -> None:
        """The function of ``call`` (of a sync body) is about to run: it returns once
        the records of the node's earlier calls are durable (all but those of
        ``record="async"`` steps), so that a call the body moved past never runs
        again."""

    async def before_run_async(self, call: Call) -> None:
        """The same, for a call of an async body."""

    def begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        """Begin an unsafe call (it is recorded ``started`` before RUN is answered)."""

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]: ...

    def end(self, call: Call, outcome: Outcome) -> None:
        """Record the call's outcome (it may still be on its way when this returns:
        the next ``before_run`` waits for it)."""

    async def end_async(self, call: Call, outcome: Outcome) -> None: ...

    def flush(self) -> None:
        """Wait until the ends sent so far are recorded (or refused): a patch marker is
        made durable this way before a call that may record out of their order (its
        own transaction, a child's start) runs."""

    async def flush_async(self) -> None: ...

    def transaction(self, call: Call) -> CallTx:
        """A transaction for ``call`` (RuntimeError when there is no database)."""

    def wait(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        """Wait (journaled): READY with the entry's outcome, or SUSPENDED (the node
        has given up its lease)."""

    async def wait_async(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]: ...

    def record(self, call: Call, conn: Any, output_json: str) -> None:
        """Record the success of ``call`` in ``conn``'s transaction (the caller's)."""

    def start_child(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        """Start the child run of ``call`` (or find the one it started): its entry,
        SUCCEEDED with {"run_id": ...}."""

    async def start_child_async(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall: ...
