"""Parts of the worker: the daemon threads that run sync handlers (reused when idle,
never shared by two handlers at once, ended when idle too long or when the worker
stops), the alarms that time its steps, and the count of step call ends answered."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import weakref

from pyclient import Workflow
from pyclient.worker import _completer, _executor, _gc, _timers
from pyclient.worker._watch import WatchPolicy
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running


def run_and_wait(threads: _executor.Threads, fn) -> threading.Thread:
    """Run ``fn`` on ``threads``, wait for it to end; the thread it ran in."""
    ran: list[threading.Thread] = []
    done = threading.Event()

    def job() -> None:
        ran.append(threading.current_thread())
        fn()
        done.set()

    threads.run(job)
    assert done.wait(PATIENCE)
    return ran[0]


def test_an_idle_thread_runs_the_next_handler():
    threads = _executor.Threads()
    first = run_and_wait(threads, lambda: None)
    eventually(lambda: threads._idle == 1, "the thread to be idle")
    assert run_and_wait(threads, lambda: None) is first
    assert first.daemon
    threads.close()
    eventually(lambda: not first.is_alive(), "the idle thread to end at close")


def test_a_stuck_handler_does_not_delay_the_next_one():
    threads = _executor.Threads()
    started, release = threading.Event(), threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(PATIENCE)

    threads.run(stuck)
    assert started.wait(PATIENCE)
    second = run_and_wait(threads, lambda: None)  # no idle thread: a new one
    release.set()
    threads.close()
    eventually(lambda: not second.is_alive(), "the idle thread to end at close")


def test_a_thread_idle_too_long_ends(monkeypatch):
    monkeypatch.setattr(_executor, "IDLE_THREAD_SECONDS", 0.05)
    threads = _executor.Threads()
    first = run_and_wait(threads, lambda: None)
    eventually(lambda: not first.is_alive(), "the idle thread to end")
    assert threads._idle == 0
    assert run_and_wait(threads, lambda: None) is not first


def test_steps_in_one_thread_each_start_with_no_context_variable_set(client, make_worker):
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    w = make_worker(concurrency=1)
    seen: list[tuple[str, int]] = []

    @w.action("step")
    def step(ctx):
        seen.append((var.get("unset"), threading.get_ident()))
        var.set(ctx.node)

    wf = Workflow("chain")
    wf.node("a", action="step")
    wf.node("b", action="step", depends_on="a")
    wf.node("c", action="step", depends_on="b")
    with running(w):
        assert client.wait(client.submit(wf), timeout=PATIENCE).status == "completed"
    assert [value for value, _ in seen] == ["unset"] * 3
    assert len({ident for _, ident in seen}) < 3  # a thread was reused


def test_alarms_due_together_share_a_timer_and_none_rings_early():
    loop = asyncio.new_event_loop()
    alarms = _timers.Alarms(loop)
    rung: list[tuple[str, float]] = []
    all_rung = loop.create_future()

    def ring(name: str) -> None:
        rung.append((name, loop.time()))
        if len(rung) == 3:
            all_rung.set_result(None)

    set_at = loop.time()
    for name in "abc":
        alarms.at(set_at + 0.05, lambda name=name: ring(name))
    assert len(alarms._timers) == 1
    loop.run_until_complete(asyncio.wait_for(all_rung, PATIENCE))
    loop.close()
    assert [name for name, _ in rung] == ["a", "b", "c"]
    assert all(at >= set_at + 0.05 for _, at in rung)
    assert not alarms._timers and not alarms._due


def test_a_cancelled_alarm_never_rings_even_when_cancelled_by_one_ringing_with_it():
    loop = asyncio.new_event_loop()
    alarms = _timers.Alarms(loop)
    rung: list[str] = []
    third_rung = loop.create_future()
    now = loop.time()
    alarms.at(now + 0.02, lambda: (rung.append("first"), second.cancel()))
    second = alarms.at(now + 0.02, lambda: rung.append("second"))
    alarms.at(now + 0.02, lambda: (rung.append("third"), third_rung.set_result(None)))
    alarms.at(now + 0.03, lambda: rung.append("never")).cancel()  # the last of its grain
    assert len(alarms._timers) == 1  # the cancelled grain's timer is gone, so never rings
    loop.run_until_complete(asyncio.wait_for(third_rung, PATIENCE))
    loop.close()
    assert rung == ["first", "third"]
    assert not alarms._timers and not alarms._due


def test_a_finished_step_is_freed_without_the_cycle_collector(client, make_worker):
    # Reference cycles left by each step made the cycle collector the largest cost of
    # a busy worker; a step's objects must go when their last reference does.
    w = make_worker(concurrency=1)
    controls: list[weakref.ref] = []

    @w.action("sync_step")
    def sync_step(ctx):
        controls.append(weakref.ref(ctx._control))

    @w.action("async_step")
    async def async_step(ctx):
        controls.append(weakref.ref(ctx._control))

    wf = Workflow("both")
    wf.node("a", action="sync_step")
    wf.node("b", action="async_step", depends_on="a")
    gc.collect()
    gc.disable()
    try:
        with running(w):
            assert client.wait(client.submit(wf), timeout=PATIENCE).status == "completed"
        assert len(controls) == 2
        # The sync handler's thread drops its arguments just after the handler returns,
        # which on a loaded machine can be after the run completed: wait for that, with
        # the collector still off (only reference counts can free them).
        eventually(
            lambda: all(ref() is None for ref in controls),
            "the steps' controls freed by reference counting",
        )
    finally:
        gc.enable()


def _unconnected_completer() -> _completer.Completer:
    """A completer on the running loop that sends nothing (its counting alone)."""
    return _completer.Completer(
        server=None,  # type: ignore[arg-type]  # nothing is sent here
        loop=asyncio.get_running_loop(),
        policy=WatchPolicy(lease=30.0),
        reconnect_max_delay=1.0,
        send_on_stream=None,  # type: ignore[arg-type]
        on_answered=lambda: None,
    )


def test_ends_count_as_answered_only_once_every_earlier_end_is():
    """Two batches of ends are in flight at once: the later may be answered first. A
    node's completion waits for the ends queued before it, so they count in order."""

    async def scenario() -> None:
        completer = _unconnected_completer()
        completer.ends_queued = 8
        waiting = asyncio.ensure_future(completer.ends_sent())
        completer._ends_answered(5, 3)  # the second batch: ends 5 to 7
        await asyncio.sleep(0)
        assert completer.ends_answered == 0 and not waiting.done()
        completer._ends_answered(0, 5)  # the first: ends 0 to 4
        await asyncio.wait_for(waiting, PATIENCE)
        assert completer.ends_answered == 8 and completer.answered_ahead == {}

    asyncio.run(scenario())


def test_a_batch_without_ends_does_not_hide_the_next():
    """A batch of begins that carried no ends has the number of the next batch of ends;
    answered after that batch, it must not overwrite its count (the ends would never
    count as answered, and every begin waiting for them would wait for good)."""

    async def scenario() -> None:
        completer = _unconnected_completer()
        completer.ends_queued = 8
        waiting = asyncio.ensure_future(completer.ends_sent())
        completer._ends_answered(5, 3)  # ends 5 to 7, answered first
        completer._ends_answered(5, 0)  # begins taken between the two batches, no ends
        completer._ends_answered(0, 5)  # ends 0 to 4
        await asyncio.wait_for(waiting, PATIENCE)
        assert completer.ends_answered == 8 and completer.answered_ahead == {}

    asyncio.run(scenario())


def test_a_serving_worker_collects_less_often_unless_the_program_chose(client, make_worker):
    """While a worker serves, the cycle collector's first threshold is raised from the
    interpreter's default, and put back when it stops; one the program set is kept."""
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []

    def serve_one(first: int) -> tuple[int, ...]:
        gc.set_threshold(first, *before[1:])
        w = make_worker(concurrency=1)

        @w.action("look")
        def look(ctx):
            seen.append(gc.get_threshold())

        wf = Workflow("gc")
        wf.node("a", action="look")
        with running(w):
            assert client.wait(client.submit(wf), timeout=PATIENCE).status == "completed"
        return gc.get_threshold()

    try:
        after = serve_one(_gc.PYTHON_DEFAULT_GEN0)
        assert seen[-1][0] == _gc.GEN0_THRESHOLD
        assert after[0] == _gc.PYTHON_DEFAULT_GEN0
        after = serve_one(5_000)
        assert seen[-1][0] == 5_000 and after[0] == 5_000
    finally:
        gc.set_threshold(*before)
