"""The replay check: journals exported from a server (``cyclone journal export``) replayed
against today's code of a durable function, in a unit test (:func:`replay`, from
pyclient.testing).

Each exported node runs its body on the worker's replay engine with a backend that
answers nothing: every call the journal answers replays, and the first call it does
not answer (past its end, or an unfinished wait or unsafe call) stops that node's
replay there, which passes. No step function runs. A node fails the check when its
replay fails (ReplayMismatch, a bad or repeated patch id) or when the body raises an
exception other than a recorded step failure it lets through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from cyclone.v1 import types_pb2
from pyclient._testing_handlers import _await, make_context
from pyclient.actions import Action
from pyclient.context import bind, unbind
from pyclient.durable._calls import Call, CallTx, Decision, Outcome, Until, WaitDecision
from pyclient.durable._errors import BodyStopped, StepFailed
from pyclient.durable._mismatch import PATCH_FUNCTION
from pyclient.durable._replay import Replay
from pyclient.models import Run, StepCall, StepCallError, StepCallStatus

#: What an export file says it is.
FORMAT = "cyclone.journals/1"


# -- export: runs as the server gives them -> JSON


def export_runs(runs: Iterable[Run], *, action: str | None = None) -> dict[str, Any]:
    """The journals of the durable nodes of ``runs`` (read with get_run), as the JSON
    of an export file: one entry per node that has a journal (of ``action`` only,
    when given)."""
    nodes = []
    for run in runs:
        outputs = {step.node: step.output for step in run.steps}
        for step in run.steps:
            if not step.journal or (action is not None and step.action != action):
                continue
            nodes.append(
                {
                    "run_id": run.run_id,
                    "workflow": run.workflow,
                    "run_status": run.status.value,
                    "node": step.node,
                    "action": step.action,
                    "status": step.status.value,
                    "attempt": step.attempt,
                    "input": step.input,
                    "run_input": run.input,
                    "upstream": {dep: outputs.get(dep) for dep in step.depends_on},
                    "journal": [_entry_json(call) for call in step.journal],
                }
            )
    return {"format": FORMAT, "nodes": nodes}


def _entry_json(call: StepCall) -> dict[str, Any]:
    error = call.error
    return {
        "step_id": call.step_id,
        "seq": call.seq,
        "function": call.function,
        "status": call.status.value,
        "unsafe_to_repeat": call.unsafe_to_repeat,
        "output": call.output,
        "error": None if error is None else dataclasses.asdict(error),
        "attempt": call.attempt,
    }


def _entry_of(data: Mapping[str, Any]) -> StepCall:
    error = data.get("error")
    return StepCall(
        step_id=str(data["step_id"]),
        seq=int(data["seq"]),
        function=str(data["function"]),
        status=StepCallStatus(data["status"]),
        unsafe_to_repeat=bool(data.get("unsafe_to_repeat", False)),
        output=data.get("output"),
        error=StepCallError(**error) if isinstance(error, dict) else None,
        attempt=int(data.get("attempt", 1)),
        started_at=None,
        finished_at=None,
    )


# -- replay


class ReplayCheckFailed(AssertionError):
    """Some exported journals do not replay on today's code: the message lists each
    run and node with what went wrong; ``results`` holds every node's result."""

    def __init__(self, message: str, results: Sequence[NodeReplay]):
        super().__init__(message)
        self.results = tuple(results)


@dataclass(frozen=True)
class NodeReplay:
    """How one exported node replayed: ``ok``, where it stopped (the first call the
    journal does not answer, or None when the body returned), how many entries were
    replayed, and the ``problem`` when it failed."""

    run_id: str
    node: str
    action: str
    ok: bool
    replayed: int
    stopped_at: str | None = None
    problem: str = ""

    def __str__(self) -> str:
        where = f"run {self.run_id} node {self.node} ({self.action})"
        if not self.ok:
            return f"{where}: {self.problem}"
        end = f"stopped at {self.stopped_at}" if self.stopped_at else "the body returned"
        return f"{where}: ok, {self.replayed} entries replayed, {end}"


@dataclass(frozen=True)
class ReplayReport:
    """What :func:`replay` checked: one result per exported node."""

    results: tuple[NodeReplay, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def __str__(self) -> str:
        return "\n".join(map(str, self.results))


class PastTheJournal(BodyStopped):
    """The replay reached a call its journal does not answer: it stops there."""


class _Unanswered:
    """A journal backend that records nothing and answers nothing: the body stops at
    the first call that would need the outside world. A patch marker (new code past
    the journal's end) is accepted: no step function runs for it."""

    def __init__(self) -> None:
        self.stopped_at: str | None = None

    def _stop(self, call: Call) -> BodyStopped:
        self.stopped_at = f"call #{call.seq} {call.step_id!r} ({call.function})"
        return PastTheJournal(f"the journal does not answer {self.stopped_at}")

    def before_run(self, call: Call) -> None:
        raise self._stop(call)

    async def before_run_async(self, call: Call) -> None:
        raise self._stop(call)

    def begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        raise self._stop(call)

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]:
        raise self._stop(call)

    def end(self, call: Call, outcome: Outcome) -> None:
        if call.function != PATCH_FUNCTION:
            raise self._stop(call)

    async def end_async(self, call: Call, outcome: Outcome) -> None:
        self.end(call, outcome)

    def flush(self) -> None:
        pass

    async def flush_async(self) -> None:
        pass

    def transaction(self, call: Call) -> CallTx:
        raise self._stop(call)

    def wait(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        raise self._stop(call)

    async def wait_async(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        raise self._stop(call)

    def record(self, call: Call, conn: Any, output_json: str) -> None:
        raise self._stop(call)

    def start_child(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        raise self._stop(call)

    async def start_child_async(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        raise self._stop(call)


def replay(
    body: Callable[..., Any],
    exported: str | Path | Mapping[str, Any],
    *,
    action: str | None = None,
) -> ReplayReport:
    """Replay each exported journal against ``body`` as it is now, in memory; raise
    :class:`ReplayCheckFailed` (an AssertionError) listing every run and node whose
    journal does not replay, with the mismatch.

    ``exported`` is the file ``cyclone journal export`` wrote (a path), or its parsed
    JSON. Only the nodes of ``action`` are replayed: by default the name
    ``@worker.workflow`` registered ``body`` under, else every node of the export. No
    step function runs: a node's replay stops at the first call its journal does not
    answer (the body went past the end of its journal, or reached a wait or an unsafe
    call that has no outcome yet) and passes. It fails on a ReplayMismatch (another
    call than the recorded one at some position), a bad or repeated patch id, or an
    exception the body raises other than a recorded step failure it lets through.

        def test_todays_code_replays_the_runs_in_flight():
            testing.replay(checkout, "journals.json")
    """
    data = _load(exported)
    if action is None:
        action = getattr(body, "__cyclone_action__", None)
    nodes = [n for n in data["nodes"] if action is None or n.get("action") == action]
    if not nodes:
        raise ReplayCheckFailed(
            f"the export holds no journal of action {action!r} "
            f"(it has {sorted({str(n.get('action')) for n in data['nodes']})})",
            (),
        )
    results = tuple(_replay_node(body, node) for node in nodes)
    report = ReplayReport(results)
    if not report.ok:
        failed = [r for r in results if not r.ok]
        raise ReplayCheckFailed(
            f"{len(failed)} of {len(results)} journals do not replay on this code "
            "(docs/durable-functions.md#the-replay-check):\n" + "\n".join(f"  {r}" for r in failed),
            results,
        )
    return report


def _load(exported: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    data = json.loads(Path(exported).read_text()) if isinstance(exported, str | Path) else exported
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise ValueError(
            "not a journal export: expected the JSON of `cyclone journal export` "
            f'({{"format": "{FORMAT}", "nodes": [...]}})'
        )
    return data


def _replay_node(body: Callable[..., Any], node: Mapping[str, Any]) -> NodeReplay:
    run_id, name = str(node["run_id"]), str(node["node"])
    action = str(node.get("action") or name)
    ctx = make_context(
        run_id=run_id,
        node=name,
        action=action,
        workflow=str(node.get("workflow") or action),
        attempt=int(node.get("attempt") or 1),
        input=node.get("input"),
        run_input=node.get("run_input"),
        upstream=node.get("upstream") or {},
    )
    handler = Action.of(action, body, durable=True)
    backend = _Unanswered()
    entries = [_entry_of(e) for e in node.get("journal") or ()]
    replay = Replay(entries, backend, is_async=handler.is_async)
    ctx = dataclasses.replace(ctx, _durable=replay)
    error: BaseException | None = None
    token = bind(ctx)
    try:
        if handler.is_async:
            asyncio.run(_await(handler, ctx))
        else:
            handler.fn(*handler.arguments(ctx))
    except (Exception, BodyStopped) as exc:
        error = exc
    finally:
        unbind(token)
    done = len(replay.replayed)
    result = NodeReplay(run_id, name, action, True, done, backend.stopped_at)
    failure = replay.failure
    if failure is None and error is not None and not isinstance(error, BodyStopped | StepFailed):
        failure = error
    if failure is not None:
        problem = f"{type(failure).__name__}: {failure}"
        return dataclasses.replace(result, ok=False, problem=problem)
    return result


__all__ = [
    "FORMAT",
    "NodeReplay",
    "PastTheJournal",
    "ReplayCheckFailed",
    "ReplayReport",
    "export_runs",
    "replay",
]
