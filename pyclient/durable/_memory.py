"""A node's journal kept in memory, as the server keeps it: the backend of the replay
engine in pyclient.testing. It follows the server's rules (docs/durable-functions.md):
Begin records an unsafe call ``started`` and answers RUN, RECORDED or UNCERTAIN; End
records an outcome once; a failed attempt forgets its trailing safe failures; Resolve
records a blocked call's result or error, or forgets it.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from google.protobuf import struct_pb2

from cyclone.jsonvalue import from_value, json_value
from cyclone.v1 import types_pb2
from pyclient.durable._calls import Call, Decision, Outcome, Until, WaitDecision
from pyclient.models import StepCall, StepCallError, StepCallStatus

#: Called by a backend at each point of a call: "begun" (an unsafe call was recorded
#: started), "before_run", "before_record" and "after_record" (its outcome).
Hook = Callable[[str, Call], None]


class NodeJournal:
    """The journal of one node, and whether the node is blocked on a call of it."""

    def __init__(self) -> None:
        self._entries: dict[str, StepCall] = {}
        #: The step id of the unsafe call the node is blocked on, if any.
        self.blocked_on: str | None = None
        #: The outcome each call's function last produced, recorded or not (what an
        #: operator would find in the outside world).
        self.produced: dict[str, Outcome] = {}
        #: The child runs started (start_child): run id -> (workflow name, input).
        self.children: dict[str, tuple[str, Any]] = {}
        #: The child runs finished (DurableNode.finish_child): run id -> (its wait's
        #: output, or its error).
        self.finished_children: dict[str, tuple[Any, StepCallError | None]] = {}
        #: Events sent to the node's run and not consumed yet, by name, oldest first.
        self.events: dict[str, list[Any]] = {}

    def entries(self) -> tuple[StepCall, ...]:
        """The entries by seq, as a claim hands them out (copies)."""
        return tuple(copy.deepcopy(sorted(self._entries.values(), key=lambda e: e.seq)))

    def get(self, step_id: str) -> StepCall | None:
        return self._entries.get(step_id)

    def begin(self, call: Call, attempt: int) -> tuple[Decision, StepCall | None]:
        entry = self._entries.get(call.step_id)
        if entry is None:
            entry = _entry(call, StepCallStatus.STARTED, None, None, attempt)
            self._entries[call.step_id] = entry
            return Decision.RUN, entry
        if entry.status != StepCallStatus.STARTED:
            return Decision.RECORDED, copy.deepcopy(entry)
        if entry.attempt == attempt:  # a repeated Begin of this attempt
            return Decision.RUN, entry
        self.blocked_on = call.step_id
        return Decision.UNCERTAIN, entry

    def end(self, call: Call, outcome: Outcome, attempt: int) -> None:
        entry = self._entries.get(call.step_id)
        if entry is not None and entry.status != StepCallStatus.STARTED:
            return  # a duplicate: the first outcome stays
        if isinstance(outcome, StepCallError):
            entry = _entry(call, StepCallStatus.FAILED, None, outcome, attempt)
        else:
            entry = _entry(call, StepCallStatus.SUCCEEDED, from_value(outcome), None, attempt)
        self._entries[call.step_id] = entry

    def wait(self, call: Call, until: Until, attempt: int) -> tuple[WaitDecision, StepCall]:
        entry = self._entries.get(call.step_id)
        if entry is not None and entry.status != StepCallStatus.WAITING:
            return WaitDecision.READY, copy.deepcopy(entry)
        if until.child_run_id is not None:
            finished = self.finished_children.get(until.child_run_id)
            if finished is None:
                return self._suspend(call, attempt)
            output, error = finished
            status = StepCallStatus.SUCCEEDED if error is None else StepCallStatus.FAILED
        elif until.event is None:
            status, output, error = StepCallStatus.SUCCEEDED, None, None
        elif self.events.get(until.event):
            status, output, error = StepCallStatus.SUCCEEDED, self.events[until.event].pop(0), None
        elif until.timeout is not None:
            status, output = StepCallStatus.FAILED, None
            error = StepCallError("EventTimeout", f"no event {until.event} came in time", "")
        else:
            return self._suspend(call, attempt)
        entry = _entry(call, status, output, error, attempt)
        self._entries[call.step_id] = entry
        return WaitDecision.READY, copy.deepcopy(entry)

    def _suspend(self, call: Call, attempt: int) -> tuple[WaitDecision, StepCall]:
        entry = _entry(call, StepCallStatus.WAITING, None, None, attempt)
        self._entries[call.step_id] = entry
        return WaitDecision.SUSPENDED, copy.deepcopy(entry)

    def finish_child(self, run_id: str, output: Any, error: StepCallError | None) -> None:
        """The child ``run_id`` finished: its wait's output (the server's shape), or
        its error."""
        if run_id not in self.children:
            raise ValueError(f"no child run {run_id!r} was started: {list(self.children)}")
        self.finished_children[run_id] = (output, error)

    def forget_trailing_failures(self) -> None:
        """What a failed attempt does: its last safe failures (after every other entry)
        are forgotten, so the next attempt calls them again."""
        while self._entries:
            last = max(self._entries.values(), key=lambda e: e.seq)
            if last.status != StepCallStatus.FAILED or last.unsafe_to_repeat:
                return
            del self._entries[last.step_id]

    def resolve(self, step_id: str, *, result: Any, error: str | None, discard: bool) -> None:
        """Settle the call the node is blocked on (ValueError if it is not that one)."""
        if self.blocked_on is None:
            raise ValueError("the node is not blocked: only a blocked call can be resolved")
        if step_id != self.blocked_on:
            raise ValueError(
                f"the node is blocked on step call {self.blocked_on!r}, not {step_id!r}"
            )
        entry = self._entries[step_id]
        if discard:
            del self._entries[step_id]
        elif error is not None:
            self._entries[step_id] = dataclasses.replace(
                entry,
                status=StepCallStatus.FAILED,
                error=StepCallError("EffectFailed", error, ""),
            )
        else:
            self._entries[step_id] = dataclasses.replace(
                entry, status=StepCallStatus.SUCCEEDED, output=copy.deepcopy(result)
            )
        self.blocked_on = None


def _entry(
    call: Call, status: StepCallStatus, output: Any, error: StepCallError | None, attempt: int
) -> StepCall:
    return StepCall(
        step_id=call.step_id,
        seq=call.seq,
        function=call.function,
        status=status,
        unsafe_to_repeat=call.unsafe,
        output=output,
        error=error,
        attempt=attempt,
        started_at=None,
        finished_at=None,
        args_digest=call.args_digest,
    )


class MemoryBackend:
    """The backend of one attempt of a node on a :class:`NodeJournal`; ``hook`` is
    called at each point of a call (pyclient.testing crashes the attempt there)."""

    def __init__(
        self,
        journal: NodeJournal,
        attempt: int,
        hook: Hook | None = None,
        connection: Any = None,
    ):
        self.journal = journal
        self.attempt = attempt
        self.hook = hook or (lambda point, call: None)
        #: What ``ctx.completion_tx()`` returns inside a step call (the test's own).
        self.connection = connection

    def before_run(self, call: Call) -> None:
        self.hook("before_run", call)

    async def before_run_async(self, call: Call) -> None:
        self.before_run(call)

    def begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        decision, entry = self.journal.begin(call, self.attempt)
        if decision is Decision.RUN:
            self.hook("begun", call)
        return decision, entry

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]:
        return self.begin(call)

    def end(self, call: Call, outcome: Outcome) -> None:
        self.journal.produced[call.step_id] = outcome
        self.hook("before_record", call)
        self.journal.end(call, outcome, self.attempt)
        self.hook("after_record", call)

    async def end_async(self, call: Call, outcome: Outcome) -> None:
        self.end(call, outcome)

    def record(self, call: Call, conn: Any, output_json: str) -> None:
        self.end(call, json_value(output_json))

    def flush(self) -> None:
        """Every end is recorded at once in memory."""

    async def flush_async(self) -> None:
        pass

    def start_child(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        """A child's start is recorded at once, with a made-up run id (no child runs
        here); ``journal.children`` keeps its workflow and input."""
        entry = self.journal.get(call.step_id)
        if entry is None:
            run_id = str(uuid.uuid4())
            self.journal.children[run_id] = (workflow.name, from_value(input))
            self.end(call, json_value(f'{{"run_id": "{run_id}"}}'))
            entry = self.journal.get(call.step_id)
        assert entry is not None
        return copy.deepcopy(entry)

    async def start_child_async(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        return self.start_child(call, workflow, input)

    def wait(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        """A wait in memory: a sleep is over at once; an event is the oldest fed one of
        its name (``journal.events``), else it times out when it has a timeout, and
        waits (SUSPENDED) when it has none."""
        return self.journal.wait(call, until, self.attempt)

    async def wait_async(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        return self.wait(call, until)

    def transaction(self, call: Call) -> MemoryTx:
        if self.connection is None:
            raise RuntimeError(
                "completion_tx() in a step call needs a connection: pass completion_conn="
            )
        return MemoryTx(self, call)


class MemoryTx:
    """A step call's transaction under test: the test's own connection, neither
    committed nor rolled back; its commit records the call in memory."""

    def __init__(self, backend: MemoryBackend, call: Call):
        self.backend = backend
        self.call = call

    def connection(self) -> Any:
        return self.backend.connection

    def commit(self, output_json: str) -> None:
        self.backend.end(self.call, json_value(output_json))

    def rollback(self) -> None:
        pass
