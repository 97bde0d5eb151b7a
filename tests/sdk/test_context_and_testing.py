"""The handler context, typed inputs, and pyclient.testing."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from pyclient import (
    InputMismatch,
    InvalidArgument,
    NonRetryableError,
    OutsideHandler,
    StepError,
    StepStatus,
    UpstreamFailure,
    current,
    testing,
)
from pyclient.actions import Action, handler_input
from pyclient.context import StepControl


@dataclasses.dataclass
class Order:
    order_id: str
    amount: int
    currency: str = "EUR"


def test_current_raises_outside_a_handler():
    with pytest.raises(OutsideHandler):
        current()


def test_idempotency_key_is_run_and_node_never_the_attempt():
    first = testing.make_context(run_id="r1", node="charge", attempt=1)
    later = dataclasses.replace(first, attempt=7)
    assert first.idempotency_key == later.idempotency_key == "r1:charge"


def test_context_is_frozen_and_its_upstream_read_only():
    ctx = testing.make_context(upstream={"charge": {"id": 1}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.attempt = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        ctx.upstream["charge"] = None  # type: ignore[index]


def test_a_cleanup_handler_under_test_reads_the_upstream_failures_it_is_given():
    declined = StepError(
        attempt=2,
        kind="handler",
        type="CardDeclined",
        message="insufficient funds",
        details="",
        retryable=False,
        at=None,
    )

    def refund(ctx):
        return [f"{f.node}: {f.error.message}" for f in ctx.upstream_failures if f.error]

    failures = [UpstreamFailure("charge", StepStatus.DISCARDED, declined)]
    assert testing.run(refund, node="refund", upstream_failures=failures) == [
        "charge: insufficient funds"
    ]
    ctx = testing.make_context(upstream_failures=failures)
    assert ctx.upstream_failures == tuple(failures)
    assert testing.make_context().upstream_failures == ()


def test_handler_sees_its_context_through_current_in_sync_and_async_code():
    def sync_handler(ctx):
        return current() is ctx

    async def async_handler(ctx):
        await asyncio.sleep(0)
        return current() is ctx

    assert testing.run(sync_handler) is True
    assert testing.run(async_handler) is True


def test_typed_input_is_built_from_node_input_over_run_input():
    def charge(ctx, order: Order):
        return dataclasses.asdict(order)

    out = testing.run(
        charge,
        run_input={"order_id": "o-1", "amount": 10, "email": "x@y"},
        input={"amount": 42},
    )
    assert out == {"order_id": "o-1", "amount": 42, "currency": "EUR"}


def test_untyped_input_gets_the_node_input_or_else_the_run_input():
    assert handler_input(testing.make_context(input=[1], run_input={"a": 1})) == [1]
    assert handler_input(testing.make_context(run_input={"a": 1})) == {"a": 1}


def test_input_that_does_not_fit_the_dataclass_fails_for_good():
    def charge(ctx, order: Order):
        return order

    with pytest.raises(InputMismatch, match="input does not fit Order") as info:
        testing.run(charge, run_input={"order_id": "o-1"})
    assert isinstance(info.value, NonRetryableError)
    with pytest.raises(InputMismatch, match="needs a JSON object"):
        testing.run(charge, run_input=[1, 2])


def test_dataclass_outputs_are_stored_as_objects():
    assert testing.run(lambda ctx: Order("o", 1)) == {
        "order_id": "o",
        "amount": 1,
        "currency": "EUR",
    }


def test_non_json_output_is_refused():
    with pytest.raises(TypeError):
        testing.run(lambda ctx: object())


@pytest.mark.parametrize(
    "handler",
    [lambda: None, lambda ctx, a, b: None],
    ids=["no-parameter", "three-parameters"],
)
def test_handlers_must_take_ctx_and_optionally_input(handler):
    with pytest.raises(InvalidArgument, match=r"must take \(ctx\) or \(ctx, input\)"):
        Action.of("a", handler)


def test_action_names_follow_the_server_rules():
    with pytest.raises(InvalidArgument, match="action name 'bad name' is invalid"):
        Action.of("bad name", lambda ctx: None)


def test_completion_tx_without_a_database_says_what_is_missing():
    with pytest.raises(RuntimeError, match="database_url"):
        testing.run(lambda ctx: ctx.completion_tx())


def test_completion_tx_in_tests_is_the_given_connection():
    conn = object()
    assert testing.run(lambda ctx: ctx.completion_tx() is conn, completion_conn=conn) is True


def test_heartbeat_progress_is_handed_to_the_worker_once_not_at_every_heartbeat():
    env = testing.HandlerEnvironment()

    def handler(ctx):
        ctx.heartbeat({"done": 3})
        ctx.heartbeat()  # no new progress: nothing to send again

    env.run(handler)
    assert env.heartbeats == 2
    assert env.progress == [{"done": 3}]


def test_stop_events_are_set_whether_asked_for_before_or_after():
    control = StepControl()
    waiting = control.should_stop  # asked for first, set later
    control.lose_lease()
    assert waiting.is_set() and control.lease_lost.is_set()  # the second made already set
    assert not control.cancelled.is_set()
    assert (control.is_stopped, control.is_lease_lost, control.is_cancelled) == (True, True, False)
    assert control.should_stop is waiting


class FakeMailer:
    def __init__(self) -> None:
        self.sent: dict[str, str] = {}
        self.outbox: list[str] = []

    def send_keyed(self, key: str, body: str) -> None:
        self.sent.setdefault(key, body)

    def send(self, body: str) -> None:
        self.outbox.append(body)


def test_run_twice_passes_a_handler_keyed_by_run_and_node():
    mailer = FakeMailer()

    def receipt(ctx):
        mailer.send_keyed(ctx.idempotency_key, "thanks")
        return {"key": ctx.idempotency_key}

    report = testing.run_twice(receipt, state=lambda: dict(mailer.sent), node="receipt")
    report.assert_safe_to_repeat()
    assert report.safe_to_repeat
    assert len(mailer.sent) == 1


def test_run_twice_catches_a_key_that_includes_the_attempt():
    mailer = FakeMailer()

    def receipt(ctx):
        mailer.send_keyed(f"{ctx.idempotency_key}:{ctx.attempt}", "thanks")

    report = testing.run_twice(receipt, state=lambda: dict(mailer.sent))
    assert not report.same_state
    with pytest.raises(AssertionError, match="not safe to repeat"):
        report.assert_safe_to_repeat()


def test_run_twice_catches_an_unkeyed_effect_and_a_changing_output():
    mailer = FakeMailer()

    def receipt(ctx):
        mailer.send("thanks")
        return len(mailer.outbox)

    report = testing.run_twice(receipt, state=lambda: list(mailer.outbox))
    assert (report.first_output, report.second_output) == (1, 2)
    assert not report.safe_to_repeat


def test_run_twice_gives_the_second_call_the_next_attempt_and_the_same_key():
    seen = []
    testing.run_twice(lambda ctx: seen.append((ctx.idempotency_key, ctx.attempt)), run_id="r")
    assert [key for key, _ in seen] == ["r:node", "r:node"]
    assert [attempt for _, attempt in seen] == [1, 2]


def export_rows(ctx):
    """A sync handler that reports progress and stops when asked to."""
    done = ctx.progress["row"] if ctx.progress else 0
    while done < 100:
        if ctx.should_stop.is_set():
            return {"stopped_at": done}
        done += 1
        if done % 10 == 0:
            ctx.heartbeat({"row": done})
    return {"exported": done}


def test_environment_records_every_heartbeat_and_its_progress():
    env = testing.HandlerEnvironment(node="export")

    def handler(ctx):
        ctx.heartbeat()
        ctx.heartbeat({"row": 1})
        ctx.heartbeat({"row": 2})
        return "done"

    assert env.run(handler) == "done"
    assert env.heartbeats == 3
    assert env.progress == [{"row": 1}, {"row": 2}]
    assert env.outcome_reported


def test_a_sync_handler_sees_the_run_cancelled_at_a_chosen_heartbeat():
    env = testing.HandlerEnvironment()
    env.on_heartbeat = lambda progress: env.cancel() if progress == {"row": 30} else None
    assert env.run(export_rows) == {"stopped_at": 30}
    assert env.ctx.cancelled.is_set() and env.ctx.should_stop.is_set()
    assert not env.ctx.lease_lost.is_set()
    assert env.progress == [{"row": 10}, {"row": 20}, {"row": 30}]
    assert not env.outcome_reported  # the worker would drop it


def test_a_sync_handler_sees_its_lease_lost():
    env = testing.HandlerEnvironment(progress={"row": 50})  # resumes an earlier attempt
    env.on_heartbeat = lambda progress: env.lose_lease()
    assert env.run(export_rows) == {"stopped_at": 60}
    assert env.ctx.lease_lost.is_set() and env.ctx.should_stop.is_set()
    assert not env.ctx.cancelled.is_set()
    assert not env.outcome_reported


def test_an_async_handler_is_cancelled_mid_run_as_the_worker_cancels_it():
    env = testing.HandlerEnvironment()
    cleaned_up = []

    async def handler(ctx):
        ctx.heartbeat({"phase": "started"})
        try:
            await asyncio.Event().wait()  # forever, unless cancelled
        finally:
            cleaned_up.append(ctx.should_stop.is_set())

    env.on_heartbeat = lambda progress: env.cancel()
    with pytest.raises(asyncio.CancelledError):
        env.run(handler)
    assert cleaned_up == [True]
    assert env.progress == [{"phase": "started"}]


def test_a_lease_lost_from_another_thread_reaches_a_waiting_handler():
    env = testing.HandlerEnvironment()
    waiting = threading.Event()

    def handler(ctx):
        waiting.set()
        return ctx.should_stop.wait(20.0)

    thread = threading.Thread(target=lambda: (waiting.wait(20.0), env.lose_lease()))
    thread.start()
    assert env.run(handler) is True
    thread.join()
    assert env.ctx.lease_lost.is_set()


def test_cancelled_before_it_starts_an_async_handler_never_runs():
    env = testing.HandlerEnvironment()
    env.cancel()
    ran = []

    async def handler(ctx):
        ran.append(1)

    with pytest.raises(asyncio.CancelledError):
        env.run(handler)
    assert ran == []


def test_progress_that_is_not_json_fails_the_heartbeat_under_test():
    env = testing.HandlerEnvironment()
    with pytest.raises(TypeError, match="progress is not JSON"):
        env.run(lambda ctx: ctx.heartbeat({"at": object()}))


def _claimed_step():
    """A claimed step with every field a Context reads from it, and what each becomes."""
    import datetime as dt

    from google.protobuf import json_format, struct_pb2

    from cyclone.v1 import types_pb2
    from cyclone.v1 import worker_service_pb2 as pb

    def value(v):
        return json_format.ParseDict(v, struct_pb2.Value())

    step = pb.ClaimedStep(
        run_id="r1",
        node="charge",
        action="pay",
        workflow="orders",
        attempt=2,
        max_attempts=5,
        lease_token="t",
        input=value({"amount": 3}),
        run_input=value(["run", None]),
        progress=value({"done": 1}),
        effect_uncertain=True,
        upstream_outputs={"a": value({"x": [1, 2]})},
        upstream_failures=[pb.UpstreamFailure(node="b", status=types_pb2.STEP_STATUS_SKIPPED)],
    )
    step.deadline.FromSeconds(1_900_000_000)
    step.run_deadline.FromSeconds(1_900_000_100)
    fields = dict(
        run_id="r1",
        node="charge",
        action="pay",
        workflow="orders",
        attempt=2,
        max_attempts=5,
        input={"amount": 3},
        run_input=["run", None],
        upstream={"a": {"x": [1, 2]}},
        deadline=dt.datetime.fromtimestamp(1_900_000_000, dt.UTC),
        progress={"done": 1},
        effect_uncertain=True,
        worker_id="w1",
        upstream_failures=(UpstreamFailure(node="b", status=StepStatus.SKIPPED, error=None),),
        run_deadline=dt.datetime.fromtimestamp(1_900_000_100, dt.UTC),
    )
    return step, fields


def test_the_workers_context_of_a_claimed_step_is_the_one_context_makes():
    # The worker's Context reads its fields from the claimed step when first asked: it
    # must hold the very values Context(...) makes of them, and behave as that value
    # does: frozen, read-only upstream, equal, replaceable, copied as a Context.
    import copy

    from pyclient.context import Context
    from pyclient.worker._context import claimed

    step, values = _claimed_step()
    control = StepControl()
    made = Context(**values, _control=control, _durable=None)
    lazy = claimed(step, "w1", control, None)
    assert isinstance(lazy, Context)
    for f in dataclasses.fields(Context):
        assert getattr(lazy, f.name) == getattr(made, f.name), f.name
    assert lazy.input is lazy.input  # made once, the same object after
    assert lazy == made and made == lazy
    assert repr(lazy) == repr(made)
    assert lazy.step_id is None
    assert lazy.idempotency_key == "r1:charge"
    assert lazy.should_stop is control.should_stop
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.input = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        lazy.upstream["b"] = 1  # type: ignore[index]
    replaced = dataclasses.replace(lazy, attempt=3)
    assert type(replaced) is Context and replaced.attempt == 3
    assert replaced.input == {"amount": 3}
    assert type(copy.copy(lazy)) is Context and copy.copy(lazy) == made


def test_a_step_calls_context_is_its_nodes_with_the_call():
    # A durable body's step call runs with its node's context and the call's step id:
    # what dataclasses.replace would make, from the worker's context or a plain one.
    from pyclient.context import Context
    from pyclient.worker._context import claimed

    step, values = _claimed_step()
    control = StepControl()
    scope = object()
    for ctx in (claimed(step, "w1", control, None), Context(**values, _control=control)):
        inside = ctx._in_call("charge#2", scope)  # type: ignore[arg-type]
        assert type(inside) is Context
        assert inside == dataclasses.replace(ctx, step_id="charge#2")
        assert inside.step_key == "r1:charge:charge#2"
        assert inside._scope is scope and inside._control is control
        assert ctx.step_id is None  # the node's own is unchanged
