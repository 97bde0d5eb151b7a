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

:class:`HandlerEnvironment` plays the worker's part around one handler, as Temporal's
ActivityEnvironment does: it records the heartbeats and progress the handler sends,
and lets the test cancel the run or take the lease away while the handler runs
(from ``on_heartbeat`` or another thread), as the worker would on a heartbeat's
answer.

    def test_export_stops_when_the_run_is_cancelled():
        env = testing.HandlerEnvironment(input={"rows": 100})
        env.on_heartbeat = lambda progress: env.cancel() if progress == {"row": 30} else None
        assert env.run(export) == {"stopped_at": 30}
        assert env.ctx.cancelled.is_set() and not env.outcome_reported

What a handler emits with ``ctx.emit`` is kept in memory as the server keeps it
(a chunk emitted again by a retry or a replay is there once); :func:`emitted` reads
it, by stream.

Durable functions run on :class:`DurableNode`: the worker's replay engine on a
journal kept in memory, with a crash injected around any step call, replays, blocks
on unsafe calls and their resolution. :func:`explore` tries every crash point:

    def test_checkout_recovers_from_any_crash():
        node = testing.DurableNode(checkout, input={"order_id": "o-1", "amount": 42})
        assert node.run(crash="charge").status == "crashed"   # charge ran, unrecorded
        assert node.run().blocked_on == "charge"              # unsafe: blocks, not rerun
        node.resolve("charge", result={"charge_id": "ch_1"})
        assert node.run().output == {"charge_id": "ch_1"}
        assert node.executions == {"reserve": 1, "charge": 1}

        testing.explore(checkout, input={"order_id": "o-1", "amount": 42}).assert_ok()

:func:`replay` is the replay check: the journals ``cyclone journal export`` took from a
server, replayed against today's code of the body, failing the test on a change that
would break a run in flight:

    def test_checkout_still_replays_production_journals():
        testing.replay(checkout, "tests/journals/checkout.json")
"""

from pyclient._replay_check import NodeReplay, ReplayCheckFailed, ReplayReport, replay
from pyclient._testing_durable import (
    END,
    Attempt,
    CrashPoint,
    DurableNode,
    Exploration,
    Scenario,
    SimulatedCrash,
    explore,
)
from pyclient._testing_handlers import (
    HandlerEnvironment,
    RepeatReport,
    emitted,
    make_context,
    run,
    run_twice,
)

__all__ = [
    "END",
    "Attempt",
    "CrashPoint",
    "DurableNode",
    "Exploration",
    "HandlerEnvironment",
    "NodeReplay",
    "RepeatReport",
    "ReplayCheckFailed",
    "ReplayReport",
    "Scenario",
    "SimulatedCrash",
    "emitted",
    "explore",
    "make_context",
    "replay",
    "run",
    "run_twice",
]
