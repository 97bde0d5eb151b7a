"""The replay engine of durable functions, driven through pyclient.testing (the same
engine the worker runs, on a journal kept in memory)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import pytest

from pyclient import (
    EffectUncertain,
    InvalidArgument,
    NonRetryableError,
    ReplayMismatch,
    StepCallError,
    StepCallStatus,
    StepFailed,
    context,
    current,
    step,
    testing,
)

#: What the steps of this module did to the outside world, in order.
effects: list[str] = []


@pytest.fixture(autouse=True)
def _clean_effects():
    effects.clear()


@step
def reserve(item: str) -> dict:
    effects.append(f"reserve {item}")
    return {"reserved": item}


@step(unsafe_to_repeat=True)
def charge(amount: int) -> dict:
    effects.append(f"charge {amount}")
    return {"charge_id": f"ch_{amount}"}


@step
def release(item: str) -> None:
    effects.append(f"release {item}")


class CardDeclined(Exception):
    pass


@step
def decline(amount: int) -> None:
    effects.append(f"decline {amount}")
    raise CardDeclined(f"card declined for {amount}")


def checkout(ctx, order: dict) -> dict:
    reserved = reserve(order["item"])
    charged = charge(order["amount"])
    return {**reserved, **charged}


ORDER = {"item": "book", "amount": 42}


def test_a_body_of_steps_completes_and_journals_each_call_in_order():
    node = testing.DurableNode(checkout, input=ORDER)
    attempt = node.run()
    assert attempt.status == "completed"
    assert attempt.output == {"reserved": "book", "charge_id": "ch_42"}
    assert [(e.seq, e.step_id, e.status, e.output) for e in node.journal] == [
        (1, "reserve", StepCallStatus.SUCCEEDED, {"reserved": "book"}),
        (2, "charge", StepCallStatus.SUCCEEDED, {"charge_id": "ch_42"}),
    ]
    assert [e.unsafe_to_repeat for e in node.journal] == [False, True]
    assert node.journal[0].function == "reserve"


def test_a_replay_after_a_crash_returns_recorded_outcomes_without_running_them():
    node = testing.DurableNode(checkout, input=ORDER)
    assert node.run(crash="charge", when="after_record").status == "crashed"
    again = node.run()
    assert again.status == "completed"
    assert again.replayed == ("reserve", "charge") and again.ran == ()
    assert effects == ["reserve book", "charge 42"]
    assert node.executions == {"reserve": 1, "charge": 1}


def test_a_safe_call_cut_off_before_its_record_runs_again():
    node = testing.DurableNode(checkout, input=ORDER)
    assert node.run(crash="reserve").crash == testing.CrashPoint("reserve")
    assert node.run().status == "completed"
    assert effects == ["reserve book", "reserve book", "charge 42"]


def test_repeated_calls_are_numbered_and_a_caller_may_name_a_call():
    def body(ctx):
        for item in ("a", "b", "c"):
            reserve(item)
        release.with_step_id("release-all")("*")
        return [e.step_id for e in node.journal]

    node = testing.DurableNode(body)
    assert node.run().output == ["reserve", "reserve#2", "reserve#3", "release-all"]


def test_a_step_name_is_the_base_of_its_step_ids():
    @step(name="tag")
    def tag_vm(vm: str) -> str:
        return vm

    def body(ctx):
        return [tag_vm("a"), tag_vm("b")]

    node = testing.DurableNode(body)
    node.run()
    assert [e.step_id for e in node.journal] == ["tag", "tag#2"]


def test_a_step_id_must_be_printable_and_at_most_200_characters():
    with pytest.raises(InvalidArgument, match="printable"):
        reserve.with_step_id("a\nb")
    with pytest.raises(InvalidArgument, match="1-200"):
        reserve.with_step_id("x" * 201)
    with pytest.raises(InvalidArgument, match="1-200"):
        step(name="")(lambda: None)


def test_two_calls_with_one_step_id_fail_the_node_for_good():
    def body(ctx):
        reserve.with_step_id("r")("a")
        reserve.with_step_id("r")("b")

    attempt = testing.DurableNode(body).run()
    assert attempt.status == "failed" and not attempt.retryable
    assert "step id 'r' is used twice" in str(attempt.error)


def test_a_recorded_failure_is_raised_again_and_its_except_block_runs_cleanup_once():
    def body(ctx, order: dict):
        reserve(order["item"])
        try:
            decline(order["amount"])
        except StepFailed as e:
            assert e.type_name == "CardDeclined"
            assert e.message == "card declined for 42"
            assert e.step_id == "decline"
            release(order["item"])
            return {"declined": str(e)}
        return {"declined": None}

    node = testing.DurableNode(body, input=ORDER)
    assert node.run(crash="release", when="after_record").status == "crashed"
    attempt = node.run()
    assert attempt.output == {"declined": "CardDeclined: card declined for 42"}
    assert attempt.replayed == ("reserve", "decline", "release")
    assert effects == ["reserve book", "decline 42", "release book"]
    entry = node.entry("decline")
    assert entry is not None and entry.status == StepCallStatus.FAILED
    assert entry.error is not None and entry.error.type == "CardDeclined"
    assert "Traceback" in entry.error.details


def test_the_first_run_raises_step_failed_too_with_the_failure_rebuilt_as_its_cause():
    caught: list[BaseException] = []

    def body(ctx):
        try:
            decline(1)
        except StepFailed as e:
            caught.append(e)

    testing.DurableNode(body).run()
    assert isinstance(caught[0].__cause__, CardDeclined)
    assert isinstance(caught[0], Exception)


class Refused(Exception):
    """A failure with attributes: a JSON one, and one that is not."""

    def __init__(self, code: str, amount: int):
        super().__init__(f"refused {code}")
        self.code = code
        self.limits = (amount, amount * 2)
        self.session = object()


@step
def refuse(amount: int) -> None:
    effects.append(f"refuse {amount}")
    raise Refused("limit", amount)


def _seen(e: StepFailed) -> dict:
    cause = e.__cause__
    return {
        "class": type(e).__name__,
        "type": e.type,
        "type_name": e.type_name,
        "message": e.message,
        "attributes": e.attributes,
        "args": e.error_args,
        "cause": type(cause).__name__,
        "same": cause is e.exception,
        "cause_args": getattr(cause, "args", None),
        "code": getattr(cause, "code", None),
        "limits": getattr(cause, "limits", None),
        "session": hasattr(cause, "session"),
    }


def test_a_caught_failure_looks_the_same_on_the_first_run_and_on_replay():
    seen: list[dict] = []

    def body(ctx):
        try:
            refuse(5)
        except StepFailed as e:
            seen.append(_seen(e))
        return release("x")

    node = testing.DurableNode(body)
    node.run(crash="release", when="before_call")
    node.run()
    assert effects == ["refuse 5", "release x"]
    assert (
        seen[0]
        == seen[1]
        == {
            "class": "StepFailed",
            "type": f"{__name__}.Refused",
            "type_name": "Refused",
            "message": "refused limit",
            "attributes": {"code": "limit", "limits": [5, 10]},
            "args": ["refused limit"],
            "cause": "Refused",
            "same": True,
            "cause_args": ("refused limit",),
            "code": "limit",
            "limits": [5, 10],
            "session": False,
        }
    )
    [entry] = [e for e in node.journal if e.step_id == "refuse"]
    assert entry.error is not None and entry.error.type == "Refused"
    assert (entry.error.module, entry.error.attributes) == (
        __name__,
        {"code": "limit", "limits": [5, 10]},
    )
    assert entry.error.details.startswith("Traceback")


def test_a_failure_recorded_without_its_module_replays_as_a_bare_step_failed():
    seen: list[dict] = []

    def body(ctx):
        try:
            decline(1)
        except StepFailed as e:
            seen.append(_seen(e))
        return release("x")

    node = testing.DurableNode(body)
    node.run(crash="release", when="before_call")
    # As an older SDK, another language or an operator's Resolve recorded it.
    entry = node._journal.get("decline")
    error = StepCallError("CardDeclined", "card declined for 1", "Traceback ...")
    node._journal._entries["decline"] = dataclasses.replace(entry, error=error)
    node.run()
    assert seen[1]["type"] == "CardDeclined" and seen[1]["cause"] == "NoneType"
    assert seen[1]["attributes"] == {} and seen[1]["message"] == "card declined for 1"


class Big(Exception):
    pass


def _caught(fn) -> list[StepFailed]:
    """The StepFailed a body catches when it calls the step ``fn``, once."""
    seen: list[StepFailed] = []

    def body(ctx):
        try:
            fn()
        except StepFailed as e:
            seen.append(e)

    testing.DurableNode(body).run()
    return seen


def test_a_failure_whose_attributes_are_too_big_keeps_the_others():
    @step
    def big() -> None:
        exc = Big("big")
        exc.blob = "x" * 20_000
        exc.small = 1
        raise exc

    seen = _caught(big)
    assert seen[0].attributes == {"small": 1}
    assert isinstance(seen[0].exception, Big) and seen[0].exception.small == 1
    assert not hasattr(seen[0].exception, "blob")


def test_a_failure_whose_class_cannot_be_found_has_no_rebuilt_exception():
    class Local(Exception):
        pass

    @step
    def local() -> None:
        raise Local("here")

    seen = _caught(local)
    assert seen[0].exception is None and seen[0].__cause__ is None
    assert seen[0].type_name.endswith("<locals>.Local") and seen[0].error_args == ["here"]


def test_a_failure_the_body_lets_through_fails_the_attempt_and_is_called_again():
    calls = collections.Counter[str]()

    @step
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise TimeoutError("upstream timed out")
        return "ok"

    def body(ctx):
        reserve("x")
        return flaky()

    node = testing.DurableNode(body)
    first = node.run()
    assert first.status == "failed" and first.retryable
    assert isinstance(first.error, StepFailed) and first.error.type_name == "TimeoutError"
    assert [e.step_id for e in node.journal] == ["reserve"]  # the trailing failure is forgotten
    second = node.run()
    assert second.output == "ok" and second.ran == ("flaky",)
    assert calls["flaky"] == 2 and effects == ["reserve x"]


def test_a_non_retryable_error_in_a_step_fails_the_node_for_good():
    @step
    def refuse() -> None:
        raise NonRetryableError("bad card")

    attempt = testing.DurableNode(lambda ctx: refuse()).run()
    assert attempt.status == "failed" and not attempt.retryable


def test_an_unsafe_call_started_by_an_earlier_attempt_blocks_instead_of_running():
    def body(ctx, order: dict):
        try:
            return checkout(ctx, order)
        except Exception:  # cannot swallow the stop
            effects.append("swallowed")
            raise

    node = testing.DurableNode(body, input=ORDER)
    node.run(crash="charge")
    blocked = node.run()
    assert blocked.status == "blocked" and blocked.blocked_on == "charge"
    assert node.status == "blocked" and node.blocked_on == "charge"
    assert effects == ["reserve book", "charge 42"]
    with pytest.raises(AssertionError, match="blocked on step call 'charge': resolve it"):
        node.run()


def test_the_stop_on_an_uncertain_call_is_a_base_exception_raised_by_every_later_call():
    seen: list[BaseException] = []

    def body(ctx):
        try:
            charge(1)
        except BaseException as e:
            seen.append(e)
        try:
            reserve("after")
        except BaseException as e:
            seen.append(e)
        return "swallowed"

    node = testing.DurableNode(body)
    node.run(crash="charge")
    seen.clear()
    assert node.run().status == "blocked"  # returning does not complete the node
    assert [type(e) for e in seen] == [EffectUncertain, EffectUncertain]
    assert not isinstance(seen[0], Exception)
    assert effects == ["charge 1"]


def test_resolve_result_returns_the_value_to_the_replay():
    node = testing.DurableNode(checkout, input=ORDER)
    node.run(crash="charge")
    node.run()
    node.resolve("charge", result={"charge_id": "ch_found"})
    attempt = node.run()
    assert attempt.output == {"reserved": "book", "charge_id": "ch_found"}
    assert node.executions == {"reserve": 1, "charge": 1}


def test_resolve_error_lets_the_except_block_run_its_cleanup():
    def body(ctx, order: dict):
        reserve(order["item"])
        try:
            charge(order["amount"])
        except StepFailed as e:
            release(order["item"])
            return {"failed": e.type_name, "why": e.message}
        return {"failed": None}

    node = testing.DurableNode(body, input=ORDER)
    node.run(crash="charge")
    node.run()
    node.resolve("charge", error="card declined")
    assert node.run().output == {"failed": "EffectFailed", "why": "card declined"}
    assert effects == ["reserve book", "charge 42", "release book"]


def test_resolve_discard_runs_the_call_again():
    node = testing.DurableNode(checkout, input=ORDER)
    node.run(crash="charge", when="before_call")
    assert effects == ["reserve book"]  # started, but the effect never happened
    assert node.run().blocked_on == "charge"
    node.resolve("charge", discard=True)
    assert node.run().status == "completed"
    assert effects == ["reserve book", "charge 42"]


def test_only_the_blocked_call_can_be_resolved_and_only_while_blocked():
    node = testing.DurableNode(checkout, input=ORDER)
    with pytest.raises(ValueError, match="not blocked"):
        node.resolve("charge", discard=True)
    node.run(crash="charge")
    node.run()
    with pytest.raises(ValueError, match="blocked on step call 'charge', not 'reserve'"):
        node.resolve("reserve", discard=True)
    with pytest.raises(TypeError, match="exactly one"):
        node.resolve("charge", result=1, discard=True)


def test_removing_the_unsafe_mark_runs_a_started_call_again():
    def send(to: str) -> str:
        effects.append(f"send {to}")
        return to

    unsafe_send = step(unsafe_to_repeat=True)(send)
    safe_send = step(send)
    use = [unsafe_send]

    def body(ctx):
        return use[0]("a@b")

    node = testing.DurableNode(body)
    node.run(crash="send")
    use[0] = safe_send  # the code that replays no longer marks it
    assert node.run().output == "a@b"
    assert effects == ["send a@b", "send a@b"]


def test_a_replay_that_calls_steps_in_another_order_fails_naming_both_step_ids():
    order = ["reserve", "charge"]

    def body(ctx):
        for name in order:
            if name == "reserve":
                reserve("x")
            else:
                charge(1)

    node = testing.DurableNode(body)
    node.run(crash="charge", when="after_record")
    order.reverse()
    attempt = node.run()
    assert attempt.status == "failed" and not attempt.retryable
    assert isinstance(attempt.error, ReplayMismatch)
    message = str(attempt.error)
    assert "call #1 recorded step 'reserve' of reserve" in message
    assert "this replay makes step 'charge' of charge there" in message
    assert "Changing code safely" in message


def test_a_replay_mismatch_fails_the_node_even_if_the_body_catches_it():
    first = [True]
    caught: list[Exception] = []

    def body(ctx):
        try:
            reserve("x") if first[0] else release("x")
        except Exception as e:
            caught.append(e)
        return "done"

    node = testing.DurableNode(body)
    node.run(crash=testing.END)
    first[0] = False
    attempt = node.run()
    assert attempt.status == "failed" and isinstance(attempt.error, ReplayMismatch)
    assert caught == [attempt.error]


def test_a_step_id_recorded_for_another_function_fails_the_replay():
    @step
    def work() -> int:
        return 1

    @step
    def other() -> int:
        return 2

    use = [work]
    node = testing.DurableNode(lambda ctx: use[0]())
    node.run(crash=testing.END)
    use[0] = other.with_step_id("work")
    attempt = node.run()
    assert isinstance(attempt.error, ReplayMismatch)
    message = str(attempt.error)
    assert "recorded step 'work' of " in message and ".work;" in message
    assert "this replay makes step 'work' of " in message and ".other there" in message


def _step_in_module(module: str, name: str | None = None):
    """A step ``lookup`` whose function says it was defined in ``module``, as the same
    code is when run as a script (``__main__``) and when imported."""

    def lookup(key: str) -> str:
        effects.append(f"lookup {key}")
        return key.upper()

    lookup.__module__ = module
    lookup.__qualname__ = "lookup"
    return step(lookup) if name is None else step(name=name)(lookup)


def test_a_step_records_its_name_without_its_module_so_a_script_replays_imported():
    use = [_step_in_module("__main__")]

    def body(ctx):
        return [use[0]("a"), release("a")]

    node = testing.DurableNode(body)
    node.run(crash="release", when="before_call")
    assert [e.function for e in node.journal] == ["lookup"]
    use[0] = _step_in_module("shop.features")
    attempt = node.run()
    assert attempt.status == "completed" and attempt.output == ["A", None]
    assert effects == ["lookup a", "release a"]


def test_a_step_name_names_the_recorded_function_so_a_renamed_function_replays():
    @step(name="work")
    def work_v1() -> int:
        effects.append("v1")
        return 1

    @step(name="work")
    def work_v2() -> int:
        effects.append("v2")
        return 2

    use = [work_v1]
    node = testing.DurableNode(lambda ctx: use[0]())
    node.run(crash=testing.END)
    assert [(e.step_id, e.function) for e in node.journal] == [("work", "work")]
    use[0] = work_v2
    assert node.run().output == 1
    assert effects == ["v1"]


@pytest.mark.parametrize(
    ("recorded", "name"),
    [("__main__.lookup", None), ("shop.features.lookup", None), ("shop.features.lookup", "x")],
)
def test_a_journal_recorded_with_the_module_in_the_function_still_replays(recorded, name):
    old = _step_in_module("shop.features", name)
    node = testing.DurableNode(lambda ctx: [old("a"), release("a")])
    node.run(crash="release", when="before_call")
    # What the journal of a run in flight holds when it was recorded as module.qualname.
    journal = node._journal
    entry = journal.get(old.name)
    journal._entries[old.name] = dataclasses.replace(entry, function=recorded)
    attempt = node.run()
    assert attempt.status == "completed" and attempt.output == ["A", None]
    assert effects == ["lookup a", "release a"]


def test_a_step_output_must_be_json():
    @step
    def opaque() -> object:
        return object()

    def body(ctx):
        return opaque()

    attempt = testing.DurableNode(body).run()
    assert attempt.status == "failed" and not attempt.retryable
    assert isinstance(attempt.error, StepFailed) and attempt.error.type_name == "TypeError"
    assert "step 'opaque' returned a value that is not JSON" in attempt.error.message


def test_the_first_run_returns_what_a_replay_will_return():
    @step
    def pair() -> tuple[int, float]:
        return (1, 2.0)

    node = testing.DurableNode(lambda ctx: pair())
    assert node.run(crash=testing.END).status == "crashed"
    first = node.executions
    assert node.run().output == [1, 2] and first == {"pair": 1}


def test_async_bodies_number_calls_when_made_so_gather_replays_deterministically():
    @step
    async def fetch(key: str) -> str:
        await asyncio.sleep(0.01 if key == "a" else 0)  # b ends first
        effects.append(f"fetch {key}")
        return key.upper()

    async def body(ctx):
        return await asyncio.gather(fetch("a"), fetch.with_step_id("fetch-b")("b"))

    node = testing.DurableNode(body)
    node.run(crash="fetch", when="before_record")  # b was recorded, a was not
    assert [(e.seq, e.step_id) for e in node.journal] == [(2, "fetch-b")]
    attempt = node.run()
    assert attempt.output == ["A", "B"] and attempt.replayed == ("fetch-b",)
    assert [(e.seq, e.step_id) for e in node.journal] == [(1, "fetch"), (2, "fetch-b")]


def test_a_sync_step_works_in_an_async_body_but_an_async_step_not_in_a_sync_body():
    @step
    async def later() -> int:
        return 1

    async def async_body(ctx):
        return reserve("x")

    assert testing.DurableNode(async_body).run().output == {"reserved": "x"}
    attempt = testing.DurableNode(lambda ctx: later()).run()
    assert isinstance(attempt.error, TypeError)
    assert "async step 'later' called from a sync durable function" in str(attempt.error)


def test_the_context_names_the_run_as_workflow_id_and_each_call_by_step_key():
    @step
    def keyed() -> dict:
        ctx = context.current()
        return {"workflow_id": ctx.workflow_id, "step_id": ctx.step_id, "key": ctx.step_key}

    def body(ctx):
        assert current().step_id is None
        with pytest.raises(RuntimeError, match="only inside a step call"):
            _ = current().step_key
        return [keyed(), keyed()]

    node = testing.DurableNode(body, run_id="r-1", node="n")
    assert node.run().output == [
        {"workflow_id": "r-1", "step_id": "keyed", "key": "r-1:n:keyed"},
        {"workflow_id": "r-1", "step_id": "keyed#2", "key": "r-1:n:keyed#2"},
    ]


def test_a_step_called_inside_a_step_call_is_part_of_it():
    @step
    def outer() -> dict:
        return reserve("inner")

    node = testing.DurableNode(lambda ctx: outer())
    assert node.run().output == {"reserved": "inner"}
    assert [e.step_id for e in node.journal] == ["outer"]


def test_outside_a_durable_function_a_step_simply_runs():
    assert reserve("free") == {"reserved": "free"}
    assert testing.run(lambda ctx: charge(3)) == {"charge_id": "ch_3"}
    with pytest.raises(CardDeclined):
        decline(1)
    assert effects == ["reserve free", "charge 3", "decline 1"]


def test_a_method_can_be_a_step():
    class Billing:
        def __init__(self) -> None:
            self.charged: list[int] = []

        @step(unsafe_to_repeat=True)
        def charge(self, amount: int) -> int:
            self.charged.append(amount)
            return amount

    billing = Billing()

    def body(ctx):
        return [billing.charge(1), billing.charge.with_step_id("big")(100)]

    node = testing.DurableNode(body)
    assert node.run().output == [1, 100]
    assert [e.step_id for e in node.journal] == ["charge", "big"]
    assert billing.charged == [1, 100]


def test_inside_a_step_call_completion_tx_is_the_calls_own_transaction():
    given = object()  # the test's connection, as testing.make_context takes it
    kept: list[object] = []

    @step
    def write() -> bool:
        kept.append(context.current()._scope)
        return context.current().completion_tx() is given

    node = testing.DurableNode(lambda ctx: write(), completion_conn=given)
    assert node.run().output is True
    with pytest.raises(RuntimeError, match="step call 'write' is over"):
        kept[0].connection()  # type: ignore[attr-defined]
    attempt = testing.DurableNode(lambda ctx: write()).run()
    assert isinstance(attempt.error, StepFailed) and attempt.error.type_name == "RuntimeError"
    assert "needs a connection" in attempt.error.message


def test_the_seeds_samples_port_with_a_changed_import():
    charges: dict[str, int] = {}

    class billing_api:
        @staticmethod
        def charge(order_id: str, amount: int, idempotency_key: str) -> str:
            charges.setdefault(idempotency_key, amount)
            return f"ch_{idempotency_key}"

    # From the seed, with `from pyclient import context, step` for its imports:
    @step
    def charge_order(order_id, amount):
        return billing_api.charge(order_id, amount, idempotency_key=f"charge:{order_id}")

    @step
    def charge_attempt(order_id, amount):
        key = f"{context.current().workflow_id}:{order_id}"
        return billing_api.charge(order_id, amount, idempotency_key=key)

    def body(ctx):
        return [charge_order("o-1", 5), charge_attempt("o-1", 5)]

    report = testing.explore(body, run_id="0192-run", state=lambda: dict(charges))
    report.assert_ok()
    assert charges == {"charge:o-1": 5, "0192-run:o-1": 5}


def test_record_step_call_records_the_call_where_the_test_says():
    @step
    def pay(amount: int) -> int:
        context.current().record_step_call(None, amount)
        return amount

    node = testing.DurableNode(lambda ctx: pay(3))
    assert node.run(crash="pay", when="after_record").status == "crashed"
    assert node.run().output == 3 and node.executions == {"pay": 1}
    with pytest.raises(RuntimeError, match="only inside a step call"):
        testing.make_context().record_step_call(None, 1)


def test_an_unsafe_calls_failure_the_body_lets_through_fails_the_node_for_good():
    @step(unsafe_to_repeat=True)
    def wire() -> None:
        raise ConnectionError("bank offline")

    node = testing.DurableNode(lambda ctx: wire())
    first = node.run()
    # Its failure stays in the journal: a retry would only replay it.
    assert first.status == "failed" and not first.retryable
    assert [e.step_id for e in node.journal] == ["wire"]
    node.run_to_end()  # an operator's Retry replays it, and fails as fast
    assert node.executions == {"wire": 1} and not node.attempts[-1].retryable


class Frozen(Exception):
    """A failure with a read-only attribute, which a rebuilt instance cannot set."""

    @property
    def code(self) -> str:
        return "fixed"


def test_a_rebuilt_failure_leaves_out_an_attribute_its_class_refuses():
    @step
    def frozen() -> None:
        exc = Frozen("cold")
        exc.__dict__["code"] = "recorded"
        exc.reason = "ice"
        raise exc

    seen = _caught(frozen)
    assert seen[0].attributes == {"code": "recorded", "reason": "ice"}
    rebuilt = seen[0].exception
    assert isinstance(rebuilt, Frozen) and rebuilt.reason == "ice" and rebuilt.code == "fixed"
