"""pyclient.testing for durable functions: :class:`DurableNode` and :func:`explore`
(see :mod:`pyclient.testing`)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cyclone.jsonvalue import dumps, from_value
from pyclient._testing_handlers import _UNSET, _await, _fresh_control, make_context
from pyclient.actions import Action
from pyclient.context import Context, bind, unbind
from pyclient.durable._calls import Call
from pyclient.durable._errors import BodyStopped, Suspended
from pyclient.durable._memory import MemoryBackend, NodeJournal
from pyclient.durable._replay import Replay
from pyclient.errors import NonRetryableError, OutputNotJson
from pyclient.models import StepCall, StepCallError

#: A crash point after the body returned, before the node's outcome was reported.
END = "<end>"

_WHEN = ("before_call", "before_record", "after_record")


@dataclass(frozen=True)
class CrashPoint:
    """Where a simulated worker dies: at the call of step ``step_id`` (or at
    :data:`END`, after the body returned), ``when``:

    - ``"before_record"``: its function ran, its outcome is not recorded yet (the
      at-least-once window);
    - ``"after_record"``: its outcome was just recorded;
    - ``"before_call"``: just before its function runs (an unsafe call is already
      recorded ``started``: the effect did not happen, but a replay cannot know).
    """

    step_id: str
    when: str = "before_record"

    def __post_init__(self) -> None:
        if self.when not in _WHEN:
            raise ValueError(f"when must be one of {', '.join(_WHEN)}, got {self.when!r}")

    def __str__(self) -> str:
        if self.step_id == END:
            return "after the body returned, before the node's outcome was reported"
        return {
            "before_call": f"as step {self.step_id!r} was about to run",
            "before_record": f"after step {self.step_id!r} ran, before its outcome was recorded",
            "after_record": f"just after the outcome of step {self.step_id!r} was recorded",
        }[self.when]


class SimulatedCrash(BodyStopped):
    """The simulated worker died here: the attempt ends, nothing more is recorded."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of a :class:`DurableNode`: how it ended and what it did.

    ``status`` is ``"completed"`` (``output`` is the node's output), ``"failed"``
    (``error`` is what the body raised), ``"crashed"`` (at ``crash``), ``"blocked"``
    (on the unsafe step call ``blocked_on``) or ``"waiting"`` (for an event with no
    timeout that was not sent: :meth:`DurableNode.send_event`, then run again; a
    sleep is over at once in memory). ``ran`` are the step ids whose function
    ran in this attempt, ``replayed`` those answered from the journal.
    """

    number: int
    status: str
    output: Any = None
    error: BaseException | None = None
    ran: tuple[str, ...] = ()
    replayed: tuple[str, ...] = ()
    crash: CrashPoint | None = None
    blocked_on: str | None = None

    @property
    def retryable(self) -> bool:
        """A failure the server would retry (not NonRetryableError, nor a StepFailed
        of one)."""
        return self.status == "failed" and not (
            isinstance(self.error, NonRetryableError) or getattr(self.error, "non_retryable", False)
        )

    def __repr__(self) -> str:
        how = {
            "completed": f"output={self.output!r}",
            "failed": f"error={self.error!r}",
            "crashed": f"crash: {self.crash}",
            "blocked": f"blocked on {self.blocked_on!r}",
            "waiting": "waiting for an event (send_event)",
        }[self.status]
        return (
            f"<Attempt {self.number} {self.status}, {how}; ran {list(self.ran)}, "
            f"replayed {list(self.replayed)}>"
        )


class DurableNode:
    """A node whose handler is the durable function ``body``, with the journal the
    server would keep for it, in memory: run attempts, crash one around any step call,
    replay, see it block on an unsafe call, resolve it.

        node = testing.DurableNode(checkout, input={"order_id": "o-1"})
        node.run(crash="charge")          # dies after charge ran, before its record
        assert node.run().blocked_on == "charge"   # unsafe: not run again
        node.resolve("charge", result={"charge_id": "ch_1"})
        assert node.run().status == "completed"
        assert node.executions == {"reserve": 1, "charge": 1}

    The replay engine is the worker's own; only the journal is in memory. Build it
    from a context or the fields of :func:`make_context`. A crash stops the body with
    :class:`SimulatedCrash`, a BaseException: its ``finally`` blocks still run (a real
    crash would not), but no step call made after the crash runs or is recorded.
    """

    def __init__(self, body: Callable[..., Any], ctx: Context | None = None, **context: Any):
        if ctx is None:
            ctx = make_context(**context)
        elif context:
            raise TypeError("pass either a context or context fields, not both")
        self.ctx = ctx
        self._action = Action.of(ctx.action, body, durable=True)
        self._journal = NodeJournal()
        #: Every attempt so far.
        self.attempts: list[Attempt] = []
        #: How many times each step call's function ran, over all attempts.
        self.executions: collections.Counter[str] = collections.Counter()
        #: The step calls made so far, by step id, in the order first made.
        self.calls: dict[str, Call] = {}
        self._armed: CrashPoint | None = None

    @property
    def journal(self) -> tuple[StepCall, ...]:
        """The node's journal now, by seq."""
        return self._journal.entries()

    def send_event(self, name: str, payload: Any = None) -> None:
        """Send the event ``name`` to the node's run: the next ``wait_for_event(name)``
        that finds no earlier one consumes it."""
        self._journal.events.setdefault(name, []).append(json.loads(dumps(payload)))

    @property
    def children(self) -> dict[str, tuple[str, Any]]:
        """The child runs the body started (``start_child``), by their made-up run id:
        (workflow name, input), in the order started."""
        return dict(self._journal.children)

    def finish_child(
        self,
        run_id: str | None = None,
        output: Any = None,
        *,
        outputs: dict[str, Any] | None = None,
        error: str | None = None,
        cancelled: bool = False,
    ) -> None:
        """Finish a child run the body started (``run_id``; default: the last one), as
        the server would: completed with ``output`` (the output of its only node,
        named after its workflow) or ``outputs`` (``{node: output}``), failed with
        ``error`` (``child.result()`` raises ChildFailed), or ``cancelled``
        (ChildCancelled). Its waiting parent resumes on the next run()."""
        children = self._journal.children
        if run_id is None:
            if not children:
                raise ValueError("the body started no child run")
            run_id = list(children)[-1]
        workflow = children[run_id][0] if run_id in children else "?"
        failure = None
        if cancelled:
            failure = StepCallError(
                "ChildCancelled", f"child run {run_id} (workflow {workflow}) was cancelled", ""
            )
        elif error is not None:
            # As the server gives it: the child run's error as the details.
            node = next(iter(outputs)) if outputs else workflow
            failed = {"kind": "StepDiscarded", "message": error, "node": node, "attempt": 1}
            failure = StepCallError(
                "ChildFailed",
                f"child run {run_id} (workflow {workflow}) failed: {error}",
                dumps(failed),
            )
        done = json.loads(dumps(outputs if outputs is not None else {workflow: output}))
        result = {"run_id": run_id, "status": "completed", "outputs": done}
        self._journal.finish_child(run_id, None if failure else result, failure)

    def entry(self, step_id: str) -> StepCall | None:
        """The journal entry of ``step_id``, if recorded."""
        return self._journal.get(step_id)

    @property
    def blocked_on(self) -> str | None:
        """The unsafe step call the node is blocked on, if it is."""
        return self._journal.blocked_on

    @property
    def status(self) -> str:
        """``"ready"`` (to run an attempt), ``"completed"``, ``"failed"`` (the last
        attempt failed: running again is a retry) or ``"blocked"``."""
        if self._journal.blocked_on is not None:
            return "blocked"
        last = self.attempts[-1].status if self.attempts else "ready"
        return last if last in ("completed", "failed") else "ready"

    def run(self, *, crash: str | CrashPoint | None = None, when: str = "before_record") -> Attempt:
        """Run one attempt of the body, replaying the journal; with ``crash``, the
        worker dies at that step call (``when``: see :class:`CrashPoint`) or at
        :data:`END`. AssertionError when the crash point is not reached."""
        point = CrashPoint(crash, when) if isinstance(crash, str) else crash
        attempt = self._attempt(point)
        if point is not None and attempt.crash is None:
            raise AssertionError(
                f"the crash point was not reached ({point}): attempt {attempt.number} ran "
                f"{list(attempt.ran)} and replayed {list(attempt.replayed)}"
            )
        return attempt

    def run_to_end(
        self,
        *,
        crash: str | CrashPoint | None = None,
        when: str = "before_record",
        max_attempts: int | None = None,
    ) -> Attempt:
        """Run attempts as the server would, until the node completes, fails for good
        or blocks; ``crash`` happens once, in the first attempt that reaches it. At
        most ``max_attempts`` attempts (default: the context's ``max_attempts``)."""
        point = CrashPoint(crash, when) if isinstance(crash, str) else crash
        limit = max_attempts or self.ctx.max_attempts
        for _ in range(limit):
            attempt = self._attempt(point)
            if attempt.crash is not None:
                point = None
            if attempt.status in ("completed", "blocked") or (
                attempt.status == "failed" and not attempt.retryable
            ):
                break
        if point is not None:
            raise AssertionError(f"the crash point was not reached ({point}): {self.attempts}")
        return attempt

    def resolve(
        self,
        step_id: str,
        *,
        result: Any = _UNSET,
        error: str | None = None,
        discard: bool = False,
    ) -> None:
        """Resolve the call the node is blocked on, as an operator would: ``result=``
        (the effect happened; this is its output), ``error=`` (it happened and
        failed: replays raise StepFailed with type_name ``"EffectFailed"``) or
        ``discard=True`` (it did not happen: the next attempt runs it)."""
        if [result is not _UNSET, error is not None, bool(discard)].count(True) != 1:
            raise TypeError("resolve needs exactly one of result=, error= or discard=True")
        if result is not _UNSET:
            result = json.loads(dumps(result))
        self._journal.resolve(step_id, result=result, error=error, discard=discard)

    def _attempt(self, point: CrashPoint | None) -> Attempt:
        if self.status == "completed":
            raise AssertionError(f"the node completed: {self.attempts[-1]!r}")
        if self._journal.blocked_on is not None:
            raise AssertionError(
                f"the node is blocked on step call {self._journal.blocked_on!r}: resolve it "
                f"first, e.g. node.resolve({self._journal.blocked_on!r}, result=...)"
            )
        number = len(self.attempts) + 1
        fired: list[CrashPoint] = []

        def hook(event: str, call: Call) -> None:
            self.calls.setdefault(call.step_id, call)
            if point is not None and not fired and point.step_id == call.step_id:
                due = {
                    "begun": "before_call",
                    "before_run": "before_call" if not call.unsafe else None,
                    "before_record": "before_record",
                    "after_record": "after_record",
                }[event]
                if due == point.when:
                    fired.append(point)
                    raise SimulatedCrash(f"simulated crash {point}")
            if event == "before_run":
                self.executions[call.step_id] += 1

        given = self.ctx._control.completion_tx
        backend = MemoryBackend(
            self._journal, number, hook, given.connection() if given is not None else None
        )
        replay = Replay(self._journal.entries(), backend, is_async=self._action.is_async)
        ctx = dataclasses.replace(
            self.ctx, attempt=number, _control=_fresh_control(self.ctx), _durable=replay
        )
        output: Any = None
        error: BaseException | None = None
        token = bind(ctx)
        try:
            if self._action.is_async:
                output = asyncio.run(_await(self._action, ctx))
            else:
                output = self._action.fn(*self._action.arguments(ctx))
        except (Exception, BodyStopped) as exc:
            error = exc
        finally:
            unbind(token)
        status = "completed"
        if fired or isinstance(replay.stopped, SimulatedCrash):
            status = "crashed"
        elif replay.uncertain is not None:
            status = "blocked"
        elif isinstance(replay.stopped, Suspended):
            status = "waiting"
        elif replay.failure is not None or error is not None:
            status, error = "failed", replay.failure or error
        elif point is not None and point.step_id == END:
            fired.append(point)
            status = "crashed"
        else:
            try:
                output = json.loads(dumps(output))
            except (TypeError, ValueError) as exc:
                status = "failed"
                error = OutputNotJson(f"the handler's output is not JSON: {exc}")
        if status == "failed":
            self._journal.forget_trailing_failures()
        attempt = Attempt(
            number=number,
            status=status,
            output=output if status == "completed" else None,
            error=error if status == "failed" else None,
            ran=tuple(replay.ran),
            replayed=tuple(replay.replayed),
            crash=fired[0] if fired else None,
            blocked_on=replay.uncertain.step_id if replay.uncertain is not None else None,
        )
        self.attempts.append(attempt)
        return attempt


@dataclass(frozen=True)
class Scenario:
    """One crash point explored by :func:`explore`: the attempts it took to the end,
    the calls it blocked on (each resolved as an operator who checked the outside
    world would), how often each step call ran, and what went wrong."""

    crash: CrashPoint
    attempts: tuple[Attempt, ...]
    executions: Mapping[str, int]
    resolved: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        end = self.attempts[-1] if self.attempts else None
        how = f"{end.status}" if end is not None else "no attempt"
        if self.resolved:
            how = f"blocked and resolved ({', '.join(self.resolved)}), then {how}"
        line = f"crash {self.crash}: {how} after {len(self.attempts)} attempt(s)"
        return line + "".join(f"\n    PROBLEM: {p}" for p in self.problems)


@dataclass(frozen=True)
class Exploration:
    """What :func:`explore` found: the run without crashes, then one scenario per
    crash point. ``assert_ok()`` fails the test with every problem found."""

    baseline: Attempt
    executions: Mapping[str, int]
    scenarios: tuple[Scenario, ...]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.scenarios)

    @property
    def problems(self) -> list[str]:
        return [f"crash {s.crash}: {p}" for s in self.scenarios for p in s.problems]

    def assert_ok(self) -> None:
        """AssertionError listing the crash points where the body misbehaved."""
        if not self.ok:
            bad = [s for s in self.scenarios if not s.ok]
            raise AssertionError(
                f"{len(bad)} of {len(self.scenarios)} crash points break the durable "
                f"function:\n" + "\n".join(str(s) for s in bad)
            )

    def __str__(self) -> str:
        head = f"without a crash: {self.baseline!r}"
        return "\n".join([head, *map(str, self.scenarios)])


def explore(
    body: Callable[..., Any],
    *,
    setup: Callable[[], None] | None = None,
    state: Callable[[], Any] | None = None,
    max_attempts: int = 10,
    **context: Any,
) -> Exploration:
    """Crash the durable function ``body`` at every point and check that it recovers.

    First the body runs to its end without a crash. Then, for each step call it made
    and each point around it (before an unsafe call's function runs, before and
    after its outcome is recorded) and after the body returned, a fresh node runs
    the body with the worker dying there, then replays it to its end, resolving any
    call it blocks on as an operator would (with the outcome the function had
    produced, or discard when it never ran). A scenario has problems when:

    - a call ran again after its outcome was recorded, or a safe call ran more than
      once more than without the crash;
    - an unsafe call interrupted before its record did not block the run;
    - the node ended otherwise than without the crash (status, output);
    - ``state()``, a snapshot of the outside world your fakes keep, differs from its
      value after the crash-free run (``setup()`` runs before each run to reset
      them).

    ``context`` are the fields of :func:`make_context` (``input=``, ``run_input=``...).

        def test_checkout_survives_any_crash():
            testing.explore(checkout, input={"order_id": "o-1"},
                            setup=fake_billing.reset,
                            state=lambda: fake_billing.charges).assert_ok()
    """

    # One run for all: the step keys, and so what keyed effects make, are the same.
    context.setdefault("run_id", str(uuid.uuid4()))

    def fresh() -> DurableNode:
        if setup is not None:
            setup()
        return DurableNode(body, **context)

    clean = fresh()
    baseline = clean.run_to_end(max_attempts=max_attempts)
    expected_state = state() if state is not None else _UNSET
    points = [
        CrashPoint(c.step_id, when)
        for c in clean.calls.values()
        for when in (("before_call",) if c.unsafe else ()) + ("before_record", "after_record")
    ] + [CrashPoint(END)]
    scenarios = []
    for point in points:
        node = fresh()
        resolved = _run_with_crash(node, point, max_attempts)
        problems = _problems(node, point, clean, resolved)
        if state is not None and (found := state()) != expected_state:
            problems.append(
                f"the outside world differs: {found!r}; without the crash: {expected_state!r}"
            )
        scenarios.append(
            Scenario(point, tuple(node.attempts), dict(node.executions), resolved, tuple(problems))
        )
    return Exploration(baseline, dict(clean.executions), tuple(scenarios))


def _run_with_crash(node: DurableNode, point: CrashPoint, max_attempts: int) -> tuple[str, ...]:
    """Run ``node`` to its end with a crash at ``point``, resolving each call it
    blocks on with what its function produced (discard when it never ran)."""
    resolved: list[str] = []
    armed: CrashPoint | None = point
    for _ in range(max_attempts):
        attempt = node._attempt(armed)
        if attempt.crash is not None:
            armed = None
        if attempt.status == "blocked":
            step_id = attempt.blocked_on
            assert step_id is not None
            produced = node._journal.produced.pop(step_id, None)
            if produced is None:
                node.resolve(step_id, discard=True)
                resolved.append(f"{step_id}: discard")
            elif isinstance(produced, StepCallError):
                node.resolve(step_id, error=produced.message)
                resolved.append(f"{step_id}: error")
            else:
                node.resolve(step_id, result=from_value(produced))
                resolved.append(f"{step_id}: result")
        elif attempt.status == "completed" or not (
            attempt.status == "crashed" or attempt.retryable
        ):
            break
    return tuple(resolved)


def _problems(
    node: DurableNode, point: CrashPoint, clean: DurableNode, resolved: tuple[str, ...]
) -> list[str]:
    problems = []
    if not any(a.crash is not None for a in node.attempts):
        problems.append("the crash point was never reached: the body took another path")
    call = clean.calls.get(point.step_id)
    for step_id, count in node.executions.items():
        allowed = clean.executions.get(step_id, 0)
        if step_id == point.step_id and point.when == "before_record" and call and not call.unsafe:
            allowed += 1  # a safe call re-runs in the at-least-once window
        if count > allowed:
            kind = "unsafe " if node.calls[step_id].unsafe else ""
            problems.append(
                f"{kind}step call {step_id!r} ran {_times(count)}, {_times(allowed)} expected"
            )
    blocked = any(r.startswith(f"{point.step_id}:") for r in resolved)
    if call is not None and call.unsafe and point.when != "after_record" and not blocked:
        problems.append(f"unsafe step call {point.step_id!r} did not block the run")
    end, expected = node.attempts[-1], clean.attempts[-1]
    if (end.status, end.output) != (expected.status, expected.output):
        problems.append(
            f"the node ended {_ending(end)}; without the crash it ended {_ending(expected)}"
        )
    return problems


def _ending(attempt: Attempt) -> str:
    if attempt.status == "completed":
        return f"completed with {attempt.output!r}"
    if attempt.status == "failed":
        return f"failed with {attempt.error!r}"
    return attempt.status


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
