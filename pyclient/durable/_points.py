"""Journal points of the replay engine: where patch markers and the applications of
updates are recorded (as safe calls' ends, the body going on at once), and where the
updates a body was sent are applied (docs/durable-functions.md, "Queries and
updates"). A base of :class:`pyclient.durable._replay.Replay`."""

from __future__ import annotations

import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from cyclone.jsonvalue import dumps, json_value
from pyclient.durable._calls import Call, JournalBackend, Outcome
from pyclient.durable._errors import StepFailed
from pyclient.durable._handlers import UPDATE_FUNCTION, UPDATE_PREFIX, BodyHandlers
from pyclient.models import StepCall, StepCallStatus

T = TypeVar("T")

#: What a patch marker records as its output.
PATCH_OUTPUT = json_value("true")
#: A wait's entry that has no outcome: not over, or never over (GetRun shows a wait of a
#: cancelled run as cancelled, as a replay check reads it).
NOT_OVER = (StepCallStatus.WAITING, StepCallStatus.CANCELLED)


class JournalPoints:
    """Patch markers and updates, recorded at the body's journal points."""

    backend: JournalBackend
    is_async: bool
    handlers: BodyHandlers
    stopped: BaseException | None
    failure: BaseException | None
    replayed: list[str]
    _seq: int
    _last_seq: int
    _has_updates: bool
    _by_seq: dict[int, StepCall]
    _by_id: dict[str, StepCall]
    _used: set[str]
    _lock: threading.Lock
    _marker_unsent: bool

    if TYPE_CHECKING:

        def _journal(self, method: Any, *args: Any) -> Any: ...

        async def _ajournal(self, pending: Awaitable[T]) -> T: ...

        def _refused(self, exc: BaseException) -> BaseException: ...

        def _fail(self, error: BaseException) -> BaseException: ...

    def _fetch_before_wait(self, entry: StepCall | None) -> None:
        """A wait is about to be asked (the node gives up its lease with it): the
        updates sent to the node are fetched first, to be applied at this point (by a
        body that takes updates: one with an update handler)."""
        fetch = getattr(self.backend, "fetch_updates", None)
        if self._fetches(fetch, entry):
            self._journal(fetch)

    async def _fetch_before_wait_async(self, entry: StepCall | None) -> None:
        fetch = getattr(self.backend, "fetch_updates_async", None)
        if fetch is not None and self._fetches(fetch, entry):
            await self._ajournal(fetch())

    def _fetches(self, fetch: Any, entry: StepCall | None) -> bool:
        asked = entry is None or entry.status in NOT_OVER
        return fetch is not None and asked and bool(self.handlers.updates)

    def markers_flushed(self) -> None:
        """Before a call runs: the patch markers recorded so far are durable. A call may
        record itself out of the order of the ends (its own transaction, a child's
        start); were it recorded and the marker before it lost, a replay would find a
        later entry and no marker, and take the old path."""
        if self._marker_unsent:
            self._journal(self.backend.flush)
            self._marker_unsent = False

    async def markers_flushed_async(self) -> None:
        if self._marker_unsent:
            await self._ajournal(self.backend.flush_async())
            self._marker_unsent = False

    # -- updates: applied at journal points, recorded there

    def _then_updates(self, method: Any, *args: Any) -> Any:
        """``method(*args)`` (a recorded outcome: its value, or its failure raised),
        with the updates due at this point applied first."""
        try:
            value = method(*args)
        except StepFailed:
            self.updates_point()
            raise
        self.updates_point()
        return value

    def updates_point(self) -> None:
        """A journal point (a step call returns, a wait is reached): the updates the
        journal records next are applied again (a replay); past the journal's end, the
        updates delivered since the last point are applied and recorded, each an entry
        after the call's (its output: the update's name, args and result or error).
        Then the queries' values are published."""
        if self.stopped is not None or self.failure is not None:
            return
        handlers = self.handlers
        if not (self._has_updates or handlers.pending or handlers.queries):
            return
        while self._has_updates:
            with self._lock:
                seq = self._seq + 1
                entry = self._by_seq.get(seq)
                if entry is None or entry.function != UPDATE_FUNCTION:
                    break
                self._seq = seq
                self._used.add(entry.step_id)
            self.replayed.append(entry.step_id)
            handlers.reapply(entry.output, entry.step_id)
        if handlers.pending and self._seq >= self._last_seq:
            for update in handlers.take():
                step_id = UPDATE_PREFIX + update.update_id
                if step_id in self._by_id or step_id in self._used:
                    continue  # recorded already: applied (or refused) once
                recorded = handlers.apply(update)
                try:
                    output = json_value(dumps(recorded))
                except (TypeError, ValueError) as exc:  # args not JSON: cannot be
                    recorded = {
                        "update": update.name,
                        "args": [],
                        "error": {"type": "TypeError", "message": str(exc)},
                    }
                    output = json_value(dumps(recorded))
                with self._lock:
                    self._seq += 1
                    self._used.add(step_id)
                    call = Call(step_id, self._seq, UPDATE_FUNCTION, False)
                self._record_marker(call, output)
                self._marker_unsent = True
        handlers.publish()

    def _record_marker(self, call: Call, output: Outcome = PATCH_OUTPUT) -> None:
        """Record a patch marker as a safe call's end, before the body goes on. In an
        async body through ``end_async``, which posts the End and does not suspend
        (patched() returns a bool, not an awaitable), so that the marker is sent in
        order with the body's other ends."""
        if not self.is_async:
            self._journal(self.backend.end, call, output)
            return
        pending = self.backend.end_async(call, output)
        try:
            pending.send(None)
        except StopIteration:
            return
        except BaseException as exc:
            raise self._refused(exc)  # noqa: B904 (the refusal is chained to exc)
        pending.close()
        raise self._fail(
            RuntimeError("the journal backend's end_async suspended on a patch marker")
        )
