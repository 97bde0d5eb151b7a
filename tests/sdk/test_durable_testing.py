"""pyclient.testing for durable functions: DurableNode's conveniences and explore()."""

from __future__ import annotations

import itertools

import pytest

from pyclient import StepFailed, context, step, testing


class FakeBilling:
    """A payment provider that suppresses a repeated idempotency key."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.unkeyed: list[int] = []

    def reset(self) -> None:
        self.charges.clear()
        self.unkeyed.clear()

    def charge(self, key: str, amount: int) -> str:
        self.charges.setdefault(key, amount)
        return f"ch_{key}"


billing = FakeBilling()


@step
def reserve(item: str) -> str:
    return f"res_{item}"


@step
def keyed_charge(amount: int) -> str:
    return billing.charge(context.current().step_key, amount)


@step
def unkeyed_charge(amount: int) -> str:
    billing.unkeyed.append(amount)
    return "ch"


@step(unsafe_to_repeat=True)
def unsafe_charge(amount: int) -> str:
    billing.unkeyed.append(amount)
    return f"ch_{amount}"


@step
def release(item: str) -> None:
    pass


def test_explore_finds_nothing_wrong_with_a_body_of_keyed_and_unsafe_steps():
    def body(ctx, order: dict):
        reserve(order["item"])
        first = keyed_charge(order["amount"])
        try:
            second = unsafe_charge(order["amount"])
        except StepFailed:
            release(order["item"])
            raise
        return [first, second]

    report = testing.explore(
        body,
        input={"item": "book", "amount": 5},
        setup=billing.reset,
        state=lambda: (dict(billing.charges), list(billing.unkeyed)),
    )
    report.assert_ok()
    assert report.baseline.output[1] == "ch_5"
    points = [(s.crash.step_id, s.crash.when) for s in report.scenarios]
    assert points == [
        ("reserve", "before_record"),
        ("reserve", "after_record"),
        ("keyed_charge", "before_record"),
        ("keyed_charge", "after_record"),
        ("unsafe_charge", "before_call"),
        ("unsafe_charge", "before_record"),
        ("unsafe_charge", "after_record"),
        (testing.END, "before_record"),
    ]
    blocked = {s.crash.when: s.resolved for s in report.scenarios if s.resolved}
    assert blocked == {
        "before_call": ("unsafe_charge: discard",),
        "before_record": ("unsafe_charge: result",),
    }
    assert all(s.executions.get("unsafe_charge") == 1 for s in report.scenarios)


def test_explore_reports_an_effect_a_safe_step_repeats_without_a_key():
    def body(ctx):
        return unkeyed_charge(7)

    report = testing.explore(body, setup=billing.reset, state=lambda: list(billing.unkeyed))
    assert not report.ok
    assert report.problems == [
        "crash after step 'unkeyed_charge' ran, before its outcome was recorded: "
        "the outside world differs: [7, 7]; without the crash: [7]"
    ]
    with pytest.raises(AssertionError, match=r"1 of 3 crash points break the durable function"):
        report.assert_ok()


def test_explore_reports_a_body_that_does_not_replay_the_same_way():
    counter = itertools.count()

    def body(ctx):
        # Branches on something other than its input and step results.
        reserve("a") if next(counter) % 2 == 0 else release("a")
        return "done"

    report = testing.explore(body)
    assert not report.ok
    assert any("ReplayMismatch" in p for p in report.problems), report.problems


def test_a_crash_point_that_is_never_reached_says_what_the_attempt_did():
    def body(ctx):
        return reserve("x")

    node = testing.DurableNode(body)
    with pytest.raises(AssertionError, match=r"not reached .*'chrage'.*ran \['reserve'\]"):
        node.run(crash="chrage")


def test_a_completed_node_does_not_run_again():
    node = testing.DurableNode(lambda ctx: reserve("x"))
    assert node.run().status == "completed" and node.status == "completed"
    with pytest.raises(AssertionError, match="the node completed"):
        node.run()


def test_run_to_end_replays_past_the_crash_and_retries_failures():
    failures = iter([True, False])

    @step
    def flaky() -> str:
        if next(failures):
            raise ConnectionError("reset")
        return "ok"

    node = testing.DurableNode(lambda ctx: [reserve("x"), flaky()], max_attempts=5)
    last = node.run_to_end(crash="reserve", when="after_record")
    assert last.output == ["res_x", "ok"]
    assert [a.status for a in node.attempts] == ["crashed", "failed", "completed"]
    assert node.executions == {"reserve": 1, "flaky": 2}


def test_an_attempt_reads_well_in_a_failed_assertion():
    node = testing.DurableNode(lambda ctx: reserve("x"))
    attempt = node.run(crash="reserve")
    assert repr(attempt) == (
        "<Attempt 1 crashed, crash: after step 'reserve' ran, before its outcome was "
        "recorded; ran ['reserve'], replayed []>"
    )
    with pytest.raises(ValueError, match="when must be one of"):
        testing.CrashPoint("reserve", "sometime")


def test_durable_node_runs_waits_in_memory():
    from pyclient import EventTimeout, sleep, wait_for_event

    @step
    def note(text: str) -> str:
        return text

    def body(ctx, _):
        note("start")
        sleep(3600)  # over at once in memory
        got = wait_for_event("go")
        try:
            wait_for_event("never", timeout=5)
        except EventTimeout:
            note("timed out")
        return got

    node = testing.DurableNode(body, input=None)
    assert node.run().status == "waiting"
    node.send_event("go", {"n": 1})
    attempt = node.run()
    assert attempt.status == "completed" and attempt.output == {"n": 1}
    assert node.executions == {"note": 1, "note#2": 1}
    assert [e.step_id for e in node.journal] == [
        "note",
        "sleep",
        "event:go",
        "event:never",
        "note#2",
    ]
