"""The replay engine: one implementation for the worker and for pyclient.testing.

Each attempt of a node whose handler is a durable function runs the body from the top
with a :class:`Replay` built from the node's journal as its claim handed it out. Every
step call gets its position (``seq``) and its step id when it is made, then:

- recorded with an outcome: the value is returned (or :class:`StepFailed` raised)
  without running the function;
- unrecorded and safe: the function runs, then its outcome is recorded (End);
- unrecorded and ``unsafe_to_repeat``: Begin first, which records it ``started``
  durably and answers RUN, RECORDED (here is its outcome) or UNCERTAIN (an earlier
  attempt started it and never recorded an outcome: the body stops with
  :class:`EffectUncertain`, and the node is left uncertain, its run blocked).

Where the journal lives is the backend's business (:class:`JournalBackend`): the
worker's sends Begin and End to the server, the one of pyclient.testing keeps the
journal in memory and can crash the "worker" around any call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
import traceback
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from google.protobuf import struct_pb2

from cyclone.jsonvalue import dumps, from_value, json_value
from cyclone.v1 import types_pb2
from pyclient.context import Context, bind, unbind
from pyclient.errors import CycloneError, LeaseLost, NonRetryableError
from pyclient.models import StepCall, StepCallError, StepCallStatus

if TYPE_CHECKING:
    from pyclient.durable._step import StepFunction

T = TypeVar("T")

#: Longest step id, function name and error type the server accepts.
MAX_ID = 200
#: Longest error message and details recorded (the server takes 64 KiB; this leaves
#: room for what the worker adds when the body lets the failure through).
MAX_ERROR_TEXT = 60 * 1024


class StepFailed(Exception):
    """A step call raised. The body sees this exception for a step's failure on every
    run: the first (``__cause__`` is then the original exception) and each replay
    (the exception's class is not rebuilt from the journal: match ``type_name``).

        try:
            charge(order)
        except StepFailed as e:
            if e.type_name != "CardDeclined":
                raise
            release(order)            # a cleanup step: it runs once, durably
    """

    def __init__(
        self,
        step_id: str,
        type_name: str,
        message: str,
        details: str = "",
        *,
        non_retryable: bool = False,
    ):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        #: The step call that raised.
        self.step_id = step_id
        #: The type name of the exception the function raised, e.g. ``"CardDeclined"``;
        #: ``"EffectFailed"`` for a failure an operator recorded with Resolve.
        self.type_name = type_name
        self.message = message
        #: Its traceback, as recorded.
        self.details = details
        #: Not worth retrying the node for if the body lets it through: the function
        #: raised NonRetryableError or returned a value that is not JSON, or the call is
        #: unsafe_to_repeat (its recorded failure is kept, so a retry would replay it).
        self.non_retryable = non_retryable


class ReplayMismatch(NonRetryableError):
    """A replay called its steps in another order than the journal recorded them (the
    code changed under a running node, or the body depends on more than its input and
    its step results). The node fails for good."""


class DuplicateStepId(NonRetryableError):
    """Two step calls of one body have the same step id."""


class BodyStopped(BaseException):
    """Stops a durable function where it stands: its node cannot go on in this attempt
    (the lease was lost, the run was cancelled, an effect is uncertain). A
    BaseException, so that ``except Exception`` in the body does not swallow it; every
    later step call raises it again, and the worker reports no outcome for the node."""


class EffectUncertain(BodyStopped):
    """An unsafe step call was started by an earlier attempt and never recorded an
    outcome: its effect may have happened. The node is uncertain and its run blocked
    until an operator resolves the call (result, error or discard)."""

    def __init__(self, call: StepCall):
        super().__init__(
            f"step call {call.step_id!r} ({call.function}) is unsafe to repeat and was "
            f"started by attempt {call.attempt} with no outcome recorded: its effect may "
            "have happened; the run is blocked until it is resolved"
        )
        self.call = call


class Suspended(BodyStopped):
    """The body waits (a durable sleep, an event, a child run) and its node has given
    up its lease: the attempt ends here, with no outcome, and the node is claimed again
    when the wait is over (its body replays up to the same wait, which then returns)."""

    def __init__(self, call: StepCall):
        super().__init__(
            f"waiting for {call.waiting_for or call.function} ({call.step_id!r}); the node "
            "resumes when the wait is over"
        )
        self.call = call


class EventTimeout(StepFailed):
    """``wait_for_event`` found no event within its timeout. Recorded in the journal, so
    every replay raises it again (a StepFailed whose ``type_name`` is ``EventTimeout``)."""


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
        """The function of ``call`` is about to run."""

    def begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        """Begin an unsafe call (it is recorded ``started`` before RUN is answered)."""

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]: ...

    def end(self, call: Call, outcome: Outcome) -> None:
        """Record the call's outcome."""

    async def end_async(self, call: Call, outcome: Outcome) -> None: ...

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


class StepScope:
    """The step call running now, as its context sees it: it opens the call's
    transaction when the function asks for it, once."""

    def __init__(self, call: Call, backend: JournalBackend):
        self.call = call
        self._backend: JournalBackend | None = backend
        self.tx: CallTx | None = None

    def connection(self) -> Any:
        if self._backend is None:
            raise RuntimeError(
                f"step call {self.call.step_id!r} is over: its completion_tx() is closed"
            )
        if self.tx is None:
            self.tx = self._backend.transaction(self.call)
        return self.tx.connection()

    def record(self, conn: Any, output: Any) -> None:
        try:
            text = dumps(output)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a step call's output must be JSON: {exc}") from None
        if self._backend is None:
            raise RuntimeError(f"step call {self.call.step_id!r} is over")
        self._backend.record(self.call, conn, text)

    def close(self) -> CallTx | None:
        """The call is over: its transaction, if one was opened, to commit or roll back."""
        self._backend = None
        return self.tx


@dataclass(slots=True)
class _Result:
    """What a function call ended with: the outcome to record (and its JSON text),
    and what the body gets."""

    outcome: Outcome
    json: str = "null"
    value: Any = None
    error: StepFailed | None = None
    #: Recorded already, by the call's own transaction.
    recorded: bool = False

    def deliver(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Replay:
    """The step calls of one attempt of a durable function, against its journal.

    ``journal`` is the node's journal as claimed; ``is_async`` whether the body is a
    coroutine function (an async step cannot be called from a sync body).
    """

    def __init__(self, journal: Iterable[StepCall], backend: JournalBackend, *, is_async: bool):
        entries = list(journal)
        self._by_seq = {e.seq: e for e in entries}
        self._by_id = {e.step_id: e for e in entries}
        self.backend = backend
        self.is_async = is_async
        self._seq = 0
        self._occurrences: dict[str, int] = {}
        self._used: set[str] = set()
        self._lock = threading.Lock()
        #: What stopped the body (BodyStopped: an uncertain effect, a lost lease, a
        #: simulated crash). Every later step call raises it again; the node's outcome
        #: is not reported.
        self.stopped: BaseException | None = None
        #: What fails the node whatever the body does (a replay mismatch, a journal
        #: write refused). Every later step call raises it again.
        self.failure: BaseException | None = None
        #: Step ids whose function ran in this attempt, in the order they returned.
        self.ran: list[str] = []
        #: Step ids answered from the journal in this attempt.
        self.replayed: list[str] = []

    @property
    def uncertain(self) -> StepCall | None:
        """The unsafe call the body stopped on because its effect is uncertain."""
        return self.stopped.call if isinstance(self.stopped, EffectUncertain) else None

    # -- making a call: its seq and step id, checked against the journal

    def open(self, fn: CallSpec, step_id: str | None) -> tuple[Call, StepCall | None]:
        """Number the call (at call time, before any await) and find its entry."""
        if fn.is_async and not self.is_async:
            raise TypeError(
                f"async step {fn.name!r} called from a sync durable function: it cannot "
                "be awaited there; make the body async, or the step sync"
            )
        with self._lock:
            self._raise_if_over()
            if step_id is None:
                n = self._occurrences[fn.name] = self._occurrences.get(fn.name, 0) + 1
                step_id = fn.name if n == 1 else f"{fn.name}#{n}"
            if step_id in self._used:
                raise self._fail(
                    DuplicateStepId(
                        f"step id {step_id!r} is used twice in this durable function; give "
                        f"one of the calls its own with {fn.name}.with_step_id(...)"
                    )
                )
            self._used.add(step_id)
            self._seq += 1
            call = Call(step_id, self._seq, fn.function, fn.unsafe_to_repeat)
        return call, self._entry(call)

    def _entry(self, call: Call) -> StepCall | None:
        entry = self._by_seq.get(call.seq)
        problem = None
        if entry is not None and entry.step_id != call.step_id:
            problem = (
                f"call #{call.seq} is step {call.step_id!r} ({call.function}), but the "
                f"journal recorded step {entry.step_id!r} ({entry.function}) there"
            )
        elif entry is None and (other := self._by_id.get(call.step_id)) is not None:
            problem = (
                f"call #{call.seq} is step {call.step_id!r}, but the journal recorded "
                f"step {other.step_id!r} as call #{other.seq}"
            )
        elif entry is not None and entry.function != call.function:
            problem = (
                f"step {call.step_id!r} (call #{call.seq}) calls {call.function}, but the "
                f"journal recorded step {entry.step_id!r} for {entry.function}"
            )
        if problem is not None:
            raise self._fail(
                ReplayMismatch(
                    f"the durable function does not replay its journal: {problem}. A body "
                    "must make the same step calls in the same order on every replay: "
                    "branch only on its input and on step results"
                )
            )
        return entry

    def _raise_if_over(self) -> None:
        if self.stopped is not None:
            raise self.stopped
        if self.failure is not None:
            raise self.failure

    def _fail(self, error: BaseException) -> BaseException:
        self.failure = error
        return error

    # -- a sync step call

    def call(
        self,
        ctx: Context,
        fn: StepFunction[..., Any],
        step_id: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        call, entry = self.open(fn, step_id)
        if entry is not None and entry.status != StepCallStatus.STARTED:
            return self._replayed(entry)
        if call.unsafe:
            decision, recorded = self._journal(self.backend.begin, call)
            if decision is not Decision.RUN:
                return self._decided(call, decision, recorded)
        with self._running(ctx, call) as scope:
            try:
                result = self._succeeded(call, fn.fn(*args, **kwargs))
            except Exception as exc:
                result = self._failed(call, exc)
        result = self._settle(scope, call, result)
        if not result.recorded:
            self._journal(self.backend.end, call, result.outcome)
        return result.deliver()

    # -- an async step call (numbered by open() when called, run when awaited)

    async def call_async(
        self,
        ctx: Context,
        fn: StepFunction[..., Any],
        call: Call,
        entry: StepCall | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if entry is not None and entry.status != StepCallStatus.STARTED:
            return self._replayed(entry)
        self._raise_if_over()
        if call.unsafe:
            decision, recorded = await self._ajournal(self.backend.begin_async(call))
            if decision is not Decision.RUN:
                return self._decided(call, decision, recorded)
        with self._running(ctx, call) as scope:
            try:
                result = self._succeeded(call, await fn.fn(*args, **kwargs))
            except Exception as exc:
                result = self._failed(call, exc)
        result = self._settle(scope, call, result)
        if not result.recorded:
            await self._ajournal(self.backend.end_async(call, result.outcome))
        return result.deliver()

    # -- a wait (sleep, event, child): numbered by open() when called

    def wait(self, call: Call, entry: StepCall | None, until: Until) -> Any:
        if entry is not None and entry.status != StepCallStatus.WAITING:
            return self._waited(entry)
        self._raise_if_over()
        return self._wait_answer(*self._journal(self.backend.wait, call, until))

    async def wait_async(self, call: Call, entry: StepCall | None, until: Until) -> Any:
        if entry is not None and entry.status != StepCallStatus.WAITING:
            return self._waited(entry)
        self._raise_if_over()
        return self._wait_answer(*await self._ajournal(self.backend.wait_async(call, until)))

    def _wait_answer(self, decision: WaitDecision, entry: StepCall) -> Any:
        if decision is WaitDecision.SUSPENDED:
            self.stopped = Suspended(entry)
            raise self.stopped
        return self._waited(entry)

    def _waited(self, entry: StepCall) -> Any:
        """A wait that is over: its value, or EventTimeout (StepFailed for another
        failure, e.g. a child's)."""
        error = entry.error
        if entry.status == StepCallStatus.FAILED and error and error.type == "EventTimeout":
            self.replayed.append(entry.step_id)
            raise EventTimeout(entry.step_id, error.type, error.message)
        return self._replayed(entry)

    # -- running the function

    @contextlib.contextmanager
    def _running(self, ctx: Context, call: Call) -> Iterator[StepScope]:
        """The function of ``call`` runs in this block, with its context bound; when it
        is cut off (cancelled, stopped) the writes of its transaction are undone."""
        self._journal(self.backend.before_run, call)
        scope = StepScope(call, self.backend)
        token = bind(dataclasses.replace(ctx, step_id=call.step_id, _scope=scope))
        try:
            yield scope
        except BaseException:
            _rollback(scope.close())
            raise
        finally:
            unbind(token)

    def _settle(self, scope: StepScope, call: Call, result: _Result) -> _Result:
        """The function returned or raised. When it used its transaction and
        succeeded, commit it with the call's record (``recorded``); a failure rolls it
        back, and End records it. (The commit is synchronous, as the node's completion
        transaction is, also in an async body.)"""
        self.ran.append(call.step_id)
        tx = scope.close()
        if tx is None or result.error is not None:
            _rollback(tx)
            return result
        try:
            self._journal(tx.commit, result.json)
        except Exception as exc:  # not recorded, its writes undone: a failure
            return self._uncommitted(call, exc)
        result.recorded = True
        return result

    # -- outcomes

    def _uncommitted(self, call: Call, exc: Exception) -> _Result:
        """The call's transaction did not commit: its writes and its record are undone.
        A refusal of the journal stops or fails the body (raised again); any other
        error (the database's) is the call's failure, recorded as such."""
        if self.stopped is not None or self.failure is not None:
            raise exc
        return self._failed(call, exc)

    def _decided(self, call: Call, decision: Decision, entry: StepCall | None) -> Any:
        if entry is None:  # a backend that breaks the contract
            raise self._fail(RuntimeError(f"Begin answered {decision.name} without an entry"))
        if decision is Decision.UNCERTAIN:
            self.stopped = EffectUncertain(entry)
            raise self.stopped
        return self._replayed(entry)

    def _replayed(self, entry: StepCall) -> Any:
        self.replayed.append(entry.step_id)
        if entry.status == StepCallStatus.SUCCEEDED:
            return entry.output
        error = entry.error or StepCallError("UnknownError", "", "")
        raise StepFailed(
            entry.step_id,
            error.type,
            error.message,
            error.details,
            non_retryable=entry.unsafe_to_repeat,
        )

    def _succeeded(self, call: Call, value: Any) -> _Result:
        try:
            text = dumps(value)
            output = json_value(text)
        except (TypeError, ValueError) as exc:
            problem = TypeError(f"step {call.step_id!r} returned a value that is not JSON: {exc}")
            return self._failed(call, problem, non_retryable=True)
        # What a replay will return: the same value, read back from the journal.
        return _Result(output, json=text, value=from_value(output))

    @staticmethod
    def _failed(call: Call, exc: Exception, *, non_retryable: bool = False) -> _Result:
        error = StepCallError(
            type=_clip(type(exc).__qualname__, MAX_ID),
            message=_clip(str(exc), MAX_ERROR_TEXT),
            details=_clip("".join(traceback.format_exception(exc)), MAX_ERROR_TEXT),
        )
        failed = StepFailed(
            call.step_id,
            error.type,
            error.message,
            error.details,
            non_retryable=non_retryable or call.unsafe or isinstance(exc, NonRetryableError),
        )
        failed.__cause__ = exc
        return _Result(error, error=failed)

    # -- the backend's answers

    def _journal(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except BaseException as exc:
            raise self._refused(exc)  # noqa: B904 (the refusal is chained to exc)

    async def _ajournal(self, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except BaseException as exc:
            raise self._refused(exc)  # noqa: B904

    def _refused(self, exc: BaseException) -> BaseException:
        """What a step call raises when the backend raised ``exc``."""
        if isinstance(exc, BodyStopped):
            self.stopped = exc
        elif isinstance(exc, LeaseLost):
            self.stopped = BodyStopped(f"the node's lease was lost: {exc.message}")
            self.stopped.__cause__ = exc
        elif isinstance(exc, CycloneError):
            self.failure = exc
        else:  # cancellation of the body, an interrupt: not the journal's business
            return exc
        return self.stopped or exc


def _rollback(tx: CallTx | None) -> None:
    """Undo a step call's writes (it failed, or was cut off)."""
    if tx is not None:
        tx.rollback()


def _clip(text: str, limit: int) -> str:
    text = text.replace("\x00", "\\0")
    return text if len(text) <= limit else text[: limit - 20] + " ...(cut)"
