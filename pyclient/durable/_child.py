"""Child runs: a durable function starts a run of another workflow and may wait for
its outcome.

    from pyclient import ChildFailed, start_child

    @worker.workflow("order")
    def order(ctx, order: dict) -> dict:
        child = start_child("ship", {"order_id": order["id"]})   # journaled: started once
        try:
            return {"shipment": child.result()}                  # waits without a slot
        except ChildFailed as failed:
            ...

The start is a step call of the body (function ``cyclone.start_child``, step id
``child``, ``child#2``... unless named): the server submits the child and records
the call in one transaction (StartChild), so a replay gets the same child back and
never starts a second. ``result()`` is a wait (function ``cyclone.child``, step id
``<start's step id>.result``): the node gives up its lease until the child finishes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cyclone.jsonvalue import to_value
from cyclone.v1 import types_pb2
from pyclient.context import active
from pyclient.durable._calls import MAX_ID, Until, WaitFn
from pyclient.durable._errors import ReplayMismatch, StepFailed
from pyclient.durable._replay import replay_of
from pyclient.errors import InvalidArgument
from pyclient.models import CHILD_START_FUNCTION as START_FUNCTION
from pyclient.models import StepCall, StepCallStatus
from pyclient.workflow import Workflow

if TYPE_CHECKING:
    from pyclient.durable._calls import Call
    from pyclient.durable._replay import Replay

#: The function of the wait for a child's outcome (Wait with child_run_id).
WAIT_FUNCTION = "cyclone.child"
#: The suffix of the wait's step id after the start's.
RESULT_SUFFIX = ".result"


class ChildFailed(StepFailed):
    """A child run failed or was cancelled: ``child.result()`` raises it, the same on
    every replay. ``type_name`` is ``"ChildFailed"`` or ``"ChildCancelled"`` and
    ``message`` the child's error. A StepFailed, so ``except StepFailed`` sees it too.

    ``child_error`` is the failed child run's error as the server recorded it (its
    ``kind``, ``message``, and the ``node`` and ``attempt`` that failed it; empty for a
    cancelled child), ``child_node`` that node."""

    def __init__(self, run_id: str, failed: StepFailed):
        super().__init__(
            failed.step_id,
            failed.type_name,
            failed.message,
            failed.details,
            non_retryable=failed.non_retryable,
            **failed.recorded(),
        )
        #: The child run.
        self.run_id = run_id
        #: The child run's error, as recorded when it failed ({} when not recorded).
        self.child_error: dict[str, Any] = _run_error(failed.details)
        #: The child's node whose failure failed it ("" when not recorded).
        node = self.child_error.get("node")
        self.child_node = node if isinstance(node, str) else ""


def _run_error(details: str) -> dict[str, Any]:
    """The run error a failed child's wait keeps as its details (JSON), or {}."""
    try:
        error = json.loads(details)
    except ValueError:
        return {}
    return error if isinstance(error, dict) else {}


#: The journal's names of a child's start ("child", "child#2"...) and of its wait
#: (named after the start: "child.result").
_START = WaitFn("child", START_FUNCTION)
_WAIT = WaitFn("child", WAIT_FUNCTION)


class ChildRun:
    """A child run started by :func:`start_child`. ``run_id`` is its id; ``result()``
    waits for its outcome (``await child.result()`` in an async body). In an async
    body, ``await start_child(...)`` gives the started child (its ``run_id`` is
    known once it is)."""

    def __init__(self, replay: Replay, call: Call):
        self._replay = replay
        self._call = call
        self._run_id: str | None = None
        self._starting: asyncio.Future[StepCall] | None = None
        #: The wait's call and its journal entry, once result() was called.
        self._wait: tuple[Call, StepCall | None] | None = None
        self._outcome: _Outcome | None = None

    def __repr__(self) -> str:
        return f"<ChildRun {self._run_id or '(starting)'} of step call {self._call.step_id!r}>"

    @property
    def step_id(self) -> str:
        """The step id of the call that started it."""
        return self._call.step_id

    @property
    def run_id(self) -> str:
        """The child run's id. In an async body, once ``await start_child(...)``."""
        if self._run_id is None:
            raise RuntimeError(
                "the child is still starting: `child = await start_child(...)` in an "
                "async durable function"
            )
        return self._run_id

    def _started(self, entry: StepCall) -> ChildRun:
        run_id = entry.output.get("run_id") if isinstance(entry.output, dict) else None
        if entry.status != StepCallStatus.SUCCEEDED or not isinstance(run_id, str):
            raise self._replay._fail(
                ReplayMismatch(
                    f"step call {entry.step_id!r} is recorded as {entry.status.value} with "
                    f"{entry.output!r}, not as the start of a child run"
                )
            )
        self._run_id = run_id
        return self

    def __await__(self) -> Generator[Any, None, ChildRun]:
        if self._starting is not None and self._run_id is None:
            self._started((yield from self._starting.__await__()))
        return self

    def result(self) -> Any:
        """The child's outcome, once it finished: the output of its only node for a
        one-node child, else ``{node: output}`` of its nodes. ChildFailed when it
        failed or was cancelled. Until then the body stops here and its node waits
        without a worker slot; the next claim replays up to here. In an async body,
        ``await child.result()``. The wait is numbered when result() is called, as a
        step call is."""
        if self._outcome is None and self._wait is None:
            self._wait = self._replay.open(_WAIT, self._call.step_id + RESULT_SUFFIX)
        if self._replay.is_async:
            return self._result_async()
        if self._outcome is None:
            assert self._wait is not None
            try:
                output = self._replay.wait(*self._wait, Until(child_run_id=self.run_id))
                self._outcome = _Outcome(_child_output(output))
            except StepFailed as failed:
                self._outcome = _Outcome(error=ChildFailed(self.run_id, failed))
        return self._outcome.deliver()

    async def _result_async(self) -> Any:
        await self
        if self._outcome is None:
            assert self._wait is not None
            try:
                until = Until(child_run_id=self.run_id)
                output = await self._replay.wait_async(*self._wait, until)
                self._outcome = _Outcome(_child_output(output))
            except StepFailed as failed:
                self._outcome = _Outcome(error=ChildFailed(self.run_id, failed))
        return self._outcome.deliver()


@dataclass(frozen=True, slots=True)
class _Outcome:
    """A child's outcome, kept so that a second result() gives it again."""

    value: Any = None
    error: ChildFailed | None = None

    def deliver(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _child_output(outcome: Any) -> Any:
    """What result() returns from the wait's output {"run_id", "status", "outputs"}."""
    outputs = outcome.get("outputs") if isinstance(outcome, dict) else None
    if not isinstance(outputs, dict):
        return outcome
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    return outputs


def child_workflow(workflow: Any) -> types_pb2.Workflow:
    """The DAG of a child: a pyclient Workflow as it is; a durable function registered
    with ``@worker.workflow`` (or its name) as the one-node workflow ``client.start``
    submits for it."""
    if isinstance(workflow, Workflow):
        workflow.validate()
        return workflow.to_proto()
    if isinstance(workflow, types_pb2.Workflow):
        return workflow
    if not isinstance(workflow, str):
        name = getattr(workflow, "__cyclone_action__", None)
        if not isinstance(name, str):
            raise InvalidArgument(
                f"start_child takes a Workflow, a @worker.workflow function or its name, "
                f"got {workflow!r}"
            )
        workflow = name
    wf = Workflow(workflow)
    wf.node(workflow, action=workflow)
    wf.validate()
    return wf.to_proto()


def start_child(workflow: Any, input: Any = None, *, step_id: str | None = None) -> ChildRun:
    """Start a child run from a durable function: ``workflow`` is a pyclient
    :class:`~pyclient.Workflow`, a durable function registered with
    ``@worker.workflow``, or its name (a one-node workflow, as ``client.start``
    submits it); ``input`` its run input. Journaled as a step call (step id ``child``,
    ``child#2``, ... or ``step_id``): a replay gets the same child back and never
    starts a second one. Cancelling this run cancels the child, unless the cancel
    keeps children. Returns a :class:`ChildRun`; in an async body, await it.
    RuntimeError outside a durable function."""
    ctx = active()
    replay = replay_of(ctx)
    if ctx is None or replay is None:
        raise RuntimeError(
            "start_child() works inside a durable function (@worker.workflow); "
            "elsewhere submit the run with client.start() or client.submit()"
        )
    proto = child_workflow(workflow)
    try:
        value = to_value(input)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"a child's input must be JSON: {exc}") from None
    if step_id is not None and len(step_id) > MAX_ID - len(RESULT_SUFFIX):
        raise InvalidArgument(
            f"a child's step id must be at most {MAX_ID - len(RESULT_SUFFIX)} characters"
        )
    call, entry = replay.open(_START, step_id)
    child = ChildRun(replay, call)
    if entry is not None:
        replay.replayed.append(call.step_id)
        return child._started(entry)
    replay.ran.append(call.step_id)
    if replay.is_async:

        async def starting() -> StepCall:
            await replay.markers_flushed_async()
            return await replay._ajournal(replay.backend.start_child_async(call, proto, value))

        child._starting = asyncio.ensure_future(starting())
        return child
    replay.markers_flushed()
    return child._started(replay._journal(replay.backend.start_child, call, proto, value))
