"""The replay engine: one implementation for the worker and for pyclient.testing.

Each attempt of a node whose handler is a durable function runs the body from the top
with a :class:`Replay` built from the node's journal as its claim handed it out. Every
step call gets its position (``seq``) and its step id when it is made, then:

- recorded with an outcome: the value is returned (or :class:`StepFailed` raised)
  without running the function;
- unrecorded and safe: the function runs, then its outcome is recorded (End). The
  body goes on at once, but the next call's function runs only once that record is
  durable (the backend's ``before_run``): the window of one call, in which a crash
  runs a call again, never reaches back past a call the body has moved on from
  (``@step(record="async")`` opts a step out of it);
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
import logging
import threading
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from cyclone.jsonvalue import dumps, from_value, json_value
from pyclient.context import Context, bind, unbind
from pyclient.durable._calls import (
    Call,
    CallSpec,
    CallTx,
    Decision,
    JournalBackend,
    Limits,
    Outcome,
    StepSpec,
    Until,
    WaitDecision,
)
from pyclient.durable._errors import (
    BodyStopped,
    DuplicateStepId,
    EffectTimedOut,
    EffectUncertain,
    EventTimeout,
    InvalidPatch,
    StepFailed,
    StepTimeout,
    Suspended,
)
from pyclient.durable._failure import record_error, step_failed
from pyclient.durable._handlers import UPDATE_FUNCTION, BodyHandlers
from pyclient.durable._mismatch import (
    MAX_PATCH_ID,
    PATCH_FUNCTION,
    PATCH_PREFIX,
    args_mismatch,
    arguments_changed,
    mismatch,
    named,
    now_making,
)
from pyclient.durable._points import NOT_OVER, JournalPoints
from pyclient.durable._scope import StepScope
from pyclient.errors import (
    CycloneError,
    JournalFull,
    LeaseLost,
    NonRetryableError,
    StepResultTooLarge,
)
from pyclient.models import StepCall, StepCallError, StepCallStatus

T = TypeVar("T")


log = logging.getLogger("pyclient.durable")

#: Room left under the server's longest error text (64 KiB by default) for what the
#: worker adds when the body lets a step's failure through.
ERROR_TEXT_ROOM = 4 * 1024


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


class Replay(JournalPoints):
    """The step calls of one attempt of a durable function, against its journal.

    ``journal`` is the node's journal as claimed; ``is_async`` whether the body is a
    coroutine function (an async step cannot be called from a sync body).
    """

    def __init__(
        self,
        journal: Iterable[StepCall],
        backend: JournalBackend,
        *,
        is_async: bool,
        limits: Limits | None = None,
    ):
        entries = list(journal)
        self.limits = limits or Limits()
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
        #: A patch marker was recorded and may not be durable yet: the next call that
        #: runs waits for it (flush) first.
        self._marker_unsent = False
        #: Step ids whose function ran in this attempt, in the order they returned.
        self.ran: list[str] = []
        #: Step ids answered from the journal in this attempt.
        self.replayed: list[str] = []
        #: The body's query and update handlers, and the updates delivered to it.
        self.handlers = BodyHandlers()
        #: The journal's last seq, and whether it records an update's application.
        self._last_seq = max(self._by_seq, default=0)
        self._has_updates = any(e.function == UPDATE_FUNCTION for e in entries)

    @property
    def uncertain(self) -> StepCall | None:
        """The unsafe call the body stopped on because its effect is uncertain."""
        return self.stopped.call if isinstance(self.stopped, EffectUncertain) else None

    # -- making a call: its seq and step id, checked against the journal

    def name_call(self, fn: CallSpec) -> str:
        """The step id of the next call of ``fn``: its name, then ``name#2``, ..."""
        with self._lock:
            self._raise_if_over()
            return self._next_id(fn)

    def _next_id(self, fn: CallSpec) -> str:
        n = self._occurrences[fn.name] = self._occurrences.get(fn.name, 0) + 1
        return fn.name if n == 1 else f"{fn.name}#{n}"

    def open(
        self, fn: CallSpec, step_id: str | None, args_digest: str = ""
    ) -> tuple[Call, StepCall | None]:
        """Number the call (at call time, before any await) and find its entry; a
        recorded entry whose arguments digest differs from ``args_digest`` is a
        mismatch (or a warning, for a step that allows it)."""
        if fn.is_async and not self.is_async:
            raise TypeError(
                f"async step {fn.name!r} called from a sync durable function: it cannot "
                "be awaited there; make the body async, or the step sync"
            )
        with self._lock:
            self._raise_if_over()
            if step_id is None:
                step_id = self._next_id(fn)
            if step_id in self._used:
                raise self._fail(
                    DuplicateStepId(
                        f"step id {step_id!r} is used twice in this durable function; give "
                        f"one of the calls its own with {fn.name}.with_step_id(...)"
                    )
                )
            if self._seq >= self.limits.max_step_calls:
                raise self._fail(
                    JournalFull(
                        f"the durable function made more than {self.limits.max_step_calls} "
                        "step calls, the most a node's journal holds (the call past it was "
                        f"{fn.name!r}); split the work into child runs (start_child), each "
                        "with its own journal"
                    )
                )
            self._used.add(step_id)
            self._seq += 1
            legacy = getattr(fn, "legacy_function", None)
            module = getattr(getattr(fn, "fn", None), "__module__", None)
            record_async = getattr(fn, "record", "window") == "async"
            call = Call(
                step_id,
                self._seq,
                fn.function,
                fn.unsafe_to_repeat,
                legacy,
                module,
                args_digest=args_digest,
                record_async=record_async,
            )
        entry = self._entry(call)
        # An entry or a call without a digest (check_args=False) is not checked.
        recorded = entry.args_digest if entry is not None else ""
        if recorded and args_digest and args_digest != recorded:
            assert entry is not None
            self._arguments_changed(call, entry, getattr(fn, "on_args_change", "fail"))
        if entry is not None and entry.function != call.function:
            # Recorded under an older form of its name: the journal keeps that one.
            call = dataclasses.replace(call, function=entry.function)
        return call, entry

    def _entry(self, call: Call) -> StepCall | None:
        entry = self._by_seq.get(call.seq)
        problem = None
        if entry is not None and entry.step_id != call.step_id:
            problem = f"call #{call.seq} recorded {named(entry)}; {now_making(call)} there"
        elif entry is None and (other := self._by_id.get(call.step_id)) is not None:
            problem = (
                f"{named(other)} was recorded as call #{other.seq}; {now_making(call)} as call "
                f"#{call.seq}"
            )
        elif entry is not None and not call.records(entry.function):
            problem = f"call #{call.seq} recorded {named(entry)}; {now_making(call)} there"
        if problem is not None:
            raise self._fail(mismatch(problem, entry))
        return entry

    # -- patch markers: patched() and deprecate_patch()

    def patch(self, patch_id: str, *, deprecated: bool = False) -> bool:
        """Whether the body takes the new branch of the patch ``patch_id`` at this
        point: True when the journal's next entry is its marker (consumed), or when
        the journal has no entry at or after the next seq (a marker is recorded, unless
        ``deprecated``); False, with no seq consumed, when the run recorded something
        else there or later (it passed this point on code without the patch)."""
        if (
            not isinstance(patch_id, str)
            or not 1 <= len(patch_id) <= MAX_PATCH_ID
            or not patch_id.isprintable()
        ):
            raise self._fail(
                InvalidPatch(
                    f"a patch id must be 1-{MAX_PATCH_ID} printable characters, got {patch_id!r}"
                )
            )
        step_id = PATCH_PREFIX + patch_id
        with self._lock:
            self._raise_if_over()
            if step_id in self._used:
                raise self._fail(
                    InvalidPatch(
                        f"patch {patch_id!r} is checked twice in this durable function "
                        "(patched() or deprecate_patch()); each patch id marks one point of "
                        "the body: give the other point its own id"
                    )
                )
            self._used.add(step_id)
            seq = self._seq + 1
            entry = self._by_seq.get(seq)
            if entry is not None and entry.step_id == step_id:
                if entry.function != PATCH_FUNCTION:
                    problem = f"call #{seq} recorded {named(entry)}; this replay checks "
                    raise self._fail(mismatch(problem + f"patch {patch_id!r} there", entry))
                self._seq = seq
                self.replayed.append(step_id)
                return True
            if (other := self._by_id.get(step_id)) is not None:
                problem = (
                    f"patch {patch_id!r} was recorded as call #{other.seq}; this replay checks "
                    f"it as call #{seq}"
                )
                raise self._fail(mismatch(problem, other))
            if any(recorded >= seq for recorded in self._by_seq):
                return False  # the run went past this point on code without the patch
            if deprecated:
                return True
            if seq > self.limits.max_step_calls:
                raise self._fail(
                    JournalFull(
                        f"the durable function made more than {self.limits.max_step_calls} "
                        f"step calls, the most a node's journal holds (the call past it was "
                        f"patch {patch_id!r})"
                    )
                )
            self._seq = seq
        call = Call(step_id, seq, PATCH_FUNCTION, False)
        self._record_marker(call)
        self._marker_unsent = True
        return True

    def _arguments_changed(self, call: Call, entry: StepCall, on_change: str) -> None:
        what = arguments_changed(call, entry)
        if on_change != "allow":
            raise self._fail(args_mismatch(what))
        log.warning(
            "%s; its recorded outcome is replayed, as @step(on_args_change='allow') asks "
            "(recorded digest %s, now %s)",
            what,
            entry.args_digest[:12],
            call.args_digest[:12],
        )

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
        fn: StepSpec,
        step_id: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        digest: str = "",
    ) -> Any:
        call, entry = self.open(fn, step_id, digest)
        if entry is not None and entry.status != StepCallStatus.STARTED:
            return self._then_updates(self._replayed, entry, call)
        self.markers_flushed()
        if call.unsafe:
            decision, recorded = self._journal(self.backend.begin, call)
            if decision is not Decision.RUN:
                return self._then_updates(self._decided, call, decision, recorded)
        self._journal(self.backend.before_run, call)
        with self._running(ctx, call) as scope:
            try:
                result = self._succeeded(call, fn.runner(*args, **kwargs))
            except Exception as exc:
                result = self._failed(call, self._uncertain_if_unsafe(call, exc))
        result = self._settle(scope, call, result)
        if not result.recorded:
            self._journal(self.backend.end, call, result.outcome)
        self.updates_point()
        return result.deliver()

    # -- an async step call (numbered by open() when called, run when awaited)

    async def call_async(
        self,
        ctx: Context,
        fn: StepSpec,
        call: Call,
        entry: StepCall | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if entry is not None and entry.status != StepCallStatus.STARTED:
            return self._then_updates(self._replayed, entry, call)
        self._raise_if_over()
        await self.markers_flushed_async()
        if call.unsafe:
            decision, recorded = await self._ajournal(self.backend.begin_async(call))
            if decision is not Decision.RUN:
                return self._then_updates(self._decided, call, decision, recorded)
        await self._ajournal(self.backend.before_run_async(call))
        with self._running(ctx, call) as scope:
            try:
                result = self._succeeded(call, await fn.runner(*args, **kwargs))
            except Exception as exc:
                result = self._failed(call, self._uncertain_if_unsafe(call, exc))
        result = self._settle(scope, call, result)
        if not result.recorded:
            await self._ajournal(self.backend.end_async(call, result.outcome))
        self.updates_point()
        return result.deliver()

    # -- a wait (sleep, event, child): numbered by open() when called

    def wait(self, call: Call, entry: StepCall | None, until: Until) -> Any:
        # Updates apply before the wait is asked (the node holds its lease until then)
        # or its recorded outcome returns: a replay applies them at the same point. The
        # ones sent meanwhile are fetched first: the node gives up its lease with the wait.
        self._fetch_before_wait(entry)
        self.updates_point()
        if entry is not None and entry.status not in NOT_OVER:
            return self._waited(entry)
        self._raise_if_over()
        return self._wait_answer(*self._journal(self.backend.wait, call, until))

    async def wait_async(self, call: Call, entry: StepCall | None, until: Until) -> Any:
        await self._fetch_before_wait_async(entry)
        self.updates_point()
        if entry is not None and entry.status not in NOT_OVER:
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
        """The function of ``call`` runs in this block (once the backend's before_run
        let it: the records of the earlier calls are durable), with its context bound;
        when it is cut off (cancelled, stopped) the writes of its transaction are
        undone."""
        scope = StepScope(call, self.backend)
        token = bind(ctx._in_call(call.step_id, scope))
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

    def _uncertain_if_unsafe(self, call: Call, exc: Exception) -> Exception:
        """``exc``, the call's failure, unless it is the timeout of an unsafe call: its
        effect is then uncertain, so nothing is recorded (its entry stays ``started``)
        and the attempt fails at once (EffectTimedOut), whatever the body does; the
        next attempt finds the call started with no outcome and blocks the run."""
        if not (call.unsafe and isinstance(exc, StepTimeout)):
            return exc
        failure = EffectTimedOut(
            f"step call {call.step_id!r} ({call.function}) is unsafe to repeat and did not "
            f"finish in time ({exc.message}); its effect is uncertain, so the next attempt "
            "blocks the run until the call is resolved",
        )
        raise self._fail(failure)

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
        return self._replayed(entry, call)

    def _replayed(self, entry: StepCall, call: Call | None = None) -> Any:
        self.replayed.append(entry.step_id)
        if entry.status == StepCallStatus.SUCCEEDED:
            return entry.output
        error = entry.error or StepCallError("UnknownError", "", "")
        raise step_failed(entry.step_id, error, call, non_retryable=entry.unsafe_to_repeat)

    def _succeeded(self, call: Call, value: Any) -> _Result:
        try:
            text = dumps(value)
            output = json_value(text)
        except (TypeError, ValueError) as exc:
            problem = TypeError(f"step {call.step_id!r} returned a value that is not JSON: {exc}")
            return self._failed(call, problem, non_retryable=True)
        limit = self.limits.max_payload_bytes
        if (size := output.ByteSize()) > limit:
            too_large = StepResultTooLarge(
                f"step {call.step_id!r} ({call.function}) returned {size} bytes; the limit "
                f"of a step result is {limit} bytes. Keep a large value outside the "
                "journal: store it elsewhere (a bucket, a table) and return a reference "
                "to it"
            )
            return self._failed(call, too_large, non_retryable=True)
        # What a replay will return: the same value, read back from the journal.
        return _Result(output, json=text, value=from_value(output))

    def _failed(self, call: Call, exc: Exception, *, non_retryable: bool = False) -> _Result:
        """The function raised ``exc``: its record, and what the body gets, which is
        what a replay will raise (the failure read back from its record)."""
        limits = self.limits
        text = max(limits.max_error_text - ERROR_TEXT_ROOM, limits.max_error_text // 2)
        error = record_error(exc, limit=text, type_limit=limits.max_name)
        retry = non_retryable or call.unsafe or isinstance(exc, NonRetryableError)
        return _Result(error, error=step_failed(call.step_id, error, call, non_retryable=retry))

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


def replay_of(ctx: Context | None) -> Replay | None:
    """The replay of the durable function that ``ctx`` runs, when the caller is its body
    (not one of its step calls); None anywhere else, where a step is a plain call."""
    if ctx is None or ctx.step_id is not None:
        return None
    replay = ctx._durable
    assert replay is None or isinstance(replay, Replay)
    return replay
