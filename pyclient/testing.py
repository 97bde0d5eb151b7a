"""Unit-test handlers without a server.

:func:`run` calls a handler the way a worker does (same context, same typed input,
``pyclient.current()`` set, the output checked to be JSON) and returns its output.

:func:`run_twice` makes the at-least-once contract checkable: it calls the handler a
second time for the same node, as a worker does after a crash or a lease expiry (same
run_id and node, so the same idempotency key; the next attempt number), and reports
both outputs and, if you pass a ``state`` function, a snapshot of the outside world
after each call. A handler is safe to repeat when the second call leaves that state
as the first one did.

    def test_charge_is_safe_to_repeat():
        report = testing.run_twice(charge, state=lambda: dict(fake_billing.charges),
                                   run_input={"order_id": "o-1", "amount": 42})
        report.assert_safe_to_repeat()
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.jsonvalue import dumps
from pyclient.actions import Action
from pyclient.context import Context, StepControl, bind, unbind
from pyclient.models import UpstreamFailure


class _GivenConnection:
    """A completion transaction that hands out the test's own connection, untouched."""

    def __init__(self, conn: Any):
        self._conn = conn

    def connection(self) -> Any:
        return self._conn


def make_context(
    *,
    run_id: str | None = None,
    node: str = "node",
    action: str | None = None,
    workflow: str = "test",
    attempt: int = 1,
    max_attempts: int = 3,
    input: Any = None,
    run_input: Any = None,
    upstream: Mapping[str, Any] | None = None,
    progress: Any = None,
    effect_uncertain: bool = False,
    upstream_failures: Sequence[UpstreamFailure] = (),
    completion_conn: Any = None,
) -> Context:
    """A context for a handler under test; ``run_id`` defaults to a fresh UUID.

    ``upstream_failures`` is what a cleanup node would receive, e.g.
    ``[UpstreamFailure("charge", StepStatus.DISCARDED, StepError(...))]``.
    ``completion_conn`` (e.g. a psycopg connection of your test database) is what
    ``ctx.completion_tx()`` returns; this helper neither commits nor rolls it back.
    """
    control = StepControl(
        completion_tx=_GivenConnection(completion_conn) if completion_conn is not None else None
    )
    return Context(
        run_id=run_id or str(uuid.uuid4()),
        node=node,
        action=action or node,
        workflow=workflow,
        attempt=attempt,
        max_attempts=max_attempts,
        input=input,
        run_input=run_input,
        upstream=upstream or {},
        progress=progress,
        effect_uncertain=effect_uncertain,
        upstream_failures=tuple(upstream_failures),
        worker_id="pyclient.testing",
        _control=control,  # type: ignore[arg-type]
    )


def run(handler: Callable[..., Any], ctx: Context | None = None, **context: Any) -> Any:
    """Call ``handler`` as a worker would and return its output as it would be stored.

    Pass a context, or the fields of :func:`make_context` as keywords. Exceptions
    raised by the handler propagate; a non-JSON output raises TypeError or ValueError.
    """
    if ctx is None:
        ctx = make_context(**context)
    elif context:
        raise TypeError("pass either a context or context fields, not both")
    action = Action.of(ctx.action, handler)
    token = bind(ctx)
    try:
        if action.is_async:
            result = asyncio.run(_await(action, ctx))
        else:
            result = action.fn(*action.arguments(ctx))
    finally:
        unbind(token)
    return json.loads(dumps(result))


async def _await(action: Action, ctx: Context) -> Any:
    bind(ctx)
    return await action.fn(*action.arguments(ctx))


_UNSET: Any = object()


@dataclass(frozen=True)
class RepeatReport:
    """Both calls of :func:`run_twice`: outputs, and state snapshots when asked for."""

    first_output: Any
    second_output: Any
    state_after_first: Any = _UNSET
    state_after_second: Any = _UNSET

    @property
    def same_output(self) -> bool:
        return self.first_output == self.second_output

    @property
    def same_state(self) -> bool:
        """The second call changed nothing the ``state`` function sees (True without one)."""
        return self.state_after_first == self.state_after_second

    @property
    def safe_to_repeat(self) -> bool:
        return self.same_state and self.same_output

    def assert_safe_to_repeat(self) -> None:
        """AssertionError saying what differed when the second call was not harmless."""
        problems = []
        if not self.same_state:
            problems.append(
                f"state after the first call: {self.state_after_first!r}\n"
                f"state after the second call: {self.state_after_second!r}"
            )
        if not self.same_output:
            problems.append(
                f"first output: {self.first_output!r}\nsecond output: {self.second_output!r}"
            )
        if problems:
            raise AssertionError(
                "the handler is not safe to repeat: a second call for the same node "
                "(same idempotency key) differs\n" + "\n".join(problems)
            )


def run_twice(
    handler: Callable[..., Any],
    ctx: Context | None = None,
    *,
    state: Callable[[], Any] | None = None,
    **context: Any,
) -> RepeatReport:
    """Call ``handler`` twice for the same node, as a reclaim after a crash would.

    The second call gets the same context with the next attempt number, so a handler
    that (wrongly) puts the attempt in its idempotency key shows up as unsafe.
    ``state`` returns a comparable snapshot of whatever the handler affects.
    """
    if ctx is None:
        ctx = make_context(**context)
    elif context:
        raise TypeError("pass either a context or context fields, not both")
    first = run(handler, ctx)
    after_first = state() if state else _UNSET
    retry = dataclasses.replace(ctx, attempt=ctx.attempt + 1, _control=_fresh_control(ctx))
    second = run(handler, retry)
    after_second = state() if state else _UNSET
    return RepeatReport(first, second, after_first, after_second)


def _fresh_control(ctx: Context) -> StepControl:
    return StepControl(completion_tx=ctx._control.completion_tx)
