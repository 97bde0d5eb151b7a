"""Waits through the raw API: Wait (durable sleep, events), SendEvent, the DAG event
node the server serves itself, resumes that use up no attempt, and hostile input."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import timestamp_pb2

from cyclone.v1 import admin_service_pb2, types_pb2, worker_service_pb2, workflow_service_pb2
from tests.helpers import (
    PATIENCE,
    claim,
    complete,
    eventually,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    seconds,
    statuses,
    submit,
    value,
    workflow,
)

READY = worker_service_pb2.WAIT_DECISION_READY
SUSPENDED = worker_service_pb2.WAIT_DECISION_SUSPENDED
WAITING = types_pb2.STEP_CALL_STATUS_WAITING
SUCCEEDED = types_pb2.STEP_CALL_STATUS_SUCCEEDED
FAILED = types_pb2.STEP_CALL_STATUS_FAILED


def server_now(server: Any) -> dt.datetime:
    now: dt.datetime = server.sql("SELECT cyclone.now()")[0][0]
    return now


def ts(when: dt.datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(when)
    return stamp


def wait_request(
    step: Any,
    step_id: str = "sleep",
    seq: int = 1,
    *,
    wake_at: dt.datetime | None = None,
    event: str | None = None,
    timeout: float | None = None,
) -> worker_service_pb2.WaitRequest:
    request = worker_service_pb2.WaitRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token, step_id=step_id, seq=seq
    )
    if wake_at is not None:
        request.wake_at.CopyFrom(ts(wake_at))
    if event is not None:
        request.event.name = event
        if timeout is not None:
            request.event.timeout.CopyFrom(seconds(timeout))
    return request


def send_event(
    server: Any, run_id: str, name: str, payload: Any = None, key: str = ""
) -> workflow_service_pb2.SendEventResponse:
    request = workflow_service_pb2.SendEventRequest(run_id=run_id, name=name, key=key)
    if payload is not None:
        request.payload.CopyFrom(value(payload))
    return server.workflows.SendEvent(request, metadata=[("cyclone-actor", "ops@example")])


def one(server: Any, action: str = "work") -> Any:
    steps = claim(server, action, n=1)
    assert len(steps) == 1, steps
    return steps[0]


def test_a_sleep_gives_up_the_lease_and_resumes_without_using_up_an_attempt(
    cyclone_server: Any,
) -> None:
    run_id = submit(cyclone_server, workflow("nap", node("a", max_attempts=2, backoff=0.001)))
    first = one(cyclone_server)
    wake = server_now(cyclone_server) + dt.timedelta(seconds=60)
    answer = cyclone_server.workers.Wait(wait_request(first, wake_at=wake))
    assert answer.decision == SUSPENDED
    assert answer.call.status == WAITING and answer.call.waiting_for == "sleep"
    assert answer.call.function == "cyclone.sleep"
    step = get_run(cyclone_server, run_id).steps[0]
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "available"}
    assert step.resumes == 1 and step.waiting_for == "sleep"
    assert step.available_at.ToDatetime(tzinfo=dt.UTC) == wake
    # The lease is over: the old token is refused, and nothing is claimable before the wake.
    assert rpc_error(complete, cyclone_server, first).code() == grpc.StatusCode.ABORTED
    assert claim(cyclone_server) == []

    cyclone_server.advance_clock(61)
    second = one(cyclone_server)
    assert second.attempt == 2
    # The claim at the wake time ended the sleep: the replay needs no Wait to go past it.
    assert [(c.step_id, c.status) for c in second.journal] == [("sleep", SUCCEEDED)]
    assert second.journal[0].finished_at.ToDatetime(tzinfo=dt.UTC) >= wake
    assert get_run(cyclone_server, run_id).steps[0].waiting_for == ""
    # A worker that sends the Wait anyway (a replay's wake time differs, computed anew)
    # is answered from the journal; the recorded wake time holds.
    again = cyclone_server.workers.Wait(
        wait_request(second, wake_at=server_now(cyclone_server) + dt.timedelta(hours=1))
    )
    assert again.decision == READY and again.call.status == SUCCEEDED
    assert again.call.wake_at.ToDatetime(tzinfo=dt.UTC) == wake
    # attempt 2 of 2, but one claim was a resume: a retryable failure is retried.
    assert fail(cyclone_server, second).status == types_pb2.STEP_STATUS_AVAILABLE
    third = eventually(lambda: claim(cyclone_server), "the retry")[0]
    assert third.attempt == 3
    # Attempt 3 minus one resume is 2: the budget is spent now.
    assert fail(cyclone_server, third).status == types_pb2.STEP_STATUS_DISCARDED
    assert get_run(cyclone_server, run_id).steps[0].waiting_for == ""


def test_a_retry_grants_a_fresh_budget_whatever_the_resumes_before_it(
    cyclone_server: Any,
) -> None:
    run_id = submit(cyclone_server, workflow("nap", node("a", max_attempts=1, backoff=0.001)))
    first = one(cyclone_server)
    wake = server_now(cyclone_server) + dt.timedelta(seconds=5)
    assert cyclone_server.workers.Wait(wait_request(first, wake_at=wake)).decision == SUSPENDED
    cyclone_server.advance_clock(6)
    second = one(cyclone_server)  # attempt 2, a resume: the first attempt still
    assert fail(cyclone_server, second).status == types_pb2.STEP_STATUS_DISCARDED
    cyclone_server.admin.Retry(
        admin_service_pb2.RetryRequest(run_id=run_id, node="a", reason="try once more")
    )
    # A budget of one attempt, as at submit: the resume before the retry grants no more.
    third = eventually(lambda: claim(cyclone_server), "the retried node")[0]
    assert third.attempt == 3
    assert fail(cyclone_server, third).status == types_pb2.STEP_STATUS_DISCARDED


def test_a_sleep_already_over_is_ready_at_once(cyclone_server: Any) -> None:
    submit(cyclone_server, workflow("nap", node("a")))
    step = one(cyclone_server)
    answer = cyclone_server.workers.Wait(
        wait_request(step, wake_at=server_now(cyclone_server) - dt.timedelta(seconds=1))
    )
    assert answer.decision == READY and answer.call.status == SUCCEEDED
    assert complete(cyclone_server, step).status == types_pb2.STEP_STATUS_COMPLETED


def test_a_stale_lease_token_is_aborted_and_writes_nothing(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("nap", node("a", max_attempts=3)))
    stale = one(cyclone_server)
    cyclone_server.advance_clock(31)
    assert cyclone_server.sweep() == 1
    fresh = one(cyclone_server)
    wake = server_now(cyclone_server) + dt.timedelta(seconds=60)
    err = rpc_error(cyclone_server.workers.Wait, wait_request(stale, wake_at=wake))
    assert err.code() == grpc.StatusCode.ABORTED
    err = rpc_error(cyclone_server.workers.Wait, wait_request(stale, event="go"))
    assert err.code() == grpc.StatusCode.ABORTED
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_calls")[0][0] == 0
    step = get_run(cyclone_server, run_id).steps[0]
    assert step.status == types_pb2.STEP_STATUS_RUNNING and step.resumes == 0
    assert step.attempt == fresh.attempt == 2


def test_an_event_sent_before_the_wait_is_kept_and_one_after_wakes_the_node(
    cyclone_server: Any,
) -> None:
    run_id = submit(cyclone_server, workflow("approval", node("a")))
    sent = send_event(cyclone_server, run_id, "approved", {"by": "ann"})
    assert sent.created and sent.event_id > 0
    step = one(cyclone_server)
    answer = cyclone_server.workers.Wait(wait_request(step, "event:approved", event="approved"))
    assert answer.decision == READY and answer.call.status == SUCCEEDED
    assert answer.call.output.struct_value.fields["by"].string_value == "ann"
    assert answer.call.waiting_for == "event approved"

    # A second wait for the same name finds nothing left: the first event is consumed.
    answer = cyclone_server.workers.Wait(
        wait_request(step, "event:approved#2", 2, event="approved")
    )
    assert answer.decision == SUSPENDED
    run = get_run(cyclone_server, run_id)
    assert run.steps[0].waiting_for == "event approved"
    assert run.steps[0].available_at.ToDatetime().year == 9999  # no timeout: until woken
    assert claim(cyclone_server) == []
    send_event(cyclone_server, run_id, "approved", {"by": "bob"})
    resumed = claim(cyclone_server, wait=PATIENCE)
    assert len(resumed) == 1 and resumed[0].attempt == 2
    answer = cyclone_server.workers.Wait(
        wait_request(resumed[0], "event:approved#2", 2, event="approved")
    )
    assert answer.decision == READY
    assert answer.call.output.struct_value.fields["by"].string_value == "bob"
    complete(cyclone_server, resumed[0], "done")
    rows = cyclone_server.sql(
        "SELECT payload->>'by', consumed_node, consumed_step_id, sent_by FROM cyclone.events"
        " WHERE run_id = %s::uuid ORDER BY event_id",
        run_id,
    )
    assert rows == [
        ("ann", "a", "event:approved", "ops@example"),
        ("bob", "a", "event:approved#2", "ops@example"),
    ]
    audit = [(a.action, a.actor) for a in get_run(cyclone_server, run_id).audit]
    assert audit == [("send_event", "ops@example")] * 2


def test_each_event_is_consumed_once_by_one_of_two_waits(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("two", node("a"), node("b")))
    first, second = claim(cyclone_server, n=2)
    for step in (first, second):
        answer = cyclone_server.workers.Wait(wait_request(step, "e", event="item"))
        assert answer.decision == SUSPENDED
    send_event(cyclone_server, run_id, "item", 1)
    send_event(cyclone_server, run_id, "item", 2)
    got = []
    for _ in range(2):
        step = eventually(lambda: claim(cyclone_server, n=1), "a woken node")[0]
        answer = cyclone_server.workers.Wait(wait_request(step, "e", event="item"))
        assert answer.decision == READY
        got.append(answer.call.output.number_value)
        complete(cyclone_server, step)
    assert sorted(got) == [1, 2]
    assert run_status(get_run(cyclone_server, run_id)) == "completed"


def test_an_event_key_makes_send_event_idempotent(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("k", node("a")))
    first = send_event(cyclone_server, run_id, "paid", {"n": 1}, key="pay-1")
    again = send_event(cyclone_server, run_id, "paid", {"n": 2}, key="pay-1")
    assert first.created and not again.created and again.event_id == first.event_id
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.events")[0][0] == 1


def test_an_event_timeout_fails_the_wait_with_event_timeout(cyclone_server: Any) -> None:
    submit(cyclone_server, workflow("late", node("a")))
    step = one(cyclone_server)
    answer = cyclone_server.workers.Wait(wait_request(step, "e", event="never", timeout=10))
    assert answer.decision == SUSPENDED
    deadline = answer.call.wake_at.ToDatetime(tzinfo=dt.UTC)
    assert claim(cyclone_server) == []
    cyclone_server.advance_clock(11)
    resumed = one(cyclone_server)
    # The replay asks with another timeout: the first deadline holds.
    answer = cyclone_server.workers.Wait(wait_request(resumed, "e", event="never", timeout=3600))
    assert answer.decision == READY and answer.call.status == FAILED
    assert answer.call.error.type == "EventTimeout"
    assert answer.call.wake_at.ToDatetime(tzinfo=dt.UTC) == deadline


def test_events_to_finished_runs_are_refused(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("k", node("a")))
    complete(cyclone_server, one(cyclone_server))
    err = rpc_error(send_event, cyclone_server, run_id, "late")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    err = rpc_error(send_event, cyclone_server, str(uuid.uuid4()), "late")
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_a_wait_in_a_blocked_run_is_held_pending(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("b", node("a"), node("u", "risky")))
    a = one(cyclone_server)
    u = one(cyclone_server, "risky")
    cyclone_server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=u.run_id,
            node=u.node,
            lease_token=u.lease_token,
            failure=worker_service_pb2.Failure(type="T", message="cut", effect_uncertain=True),
        )
    )
    answer = cyclone_server.workers.Wait(wait_request(a, "e", event="go"))
    assert answer.decision == SUSPENDED
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "pending", "u": "uncertain"}


HOSTILE_WAITS = [
    ("no until", {}),
    ("seq 0", {"seq": 0, "wake_at": True}),
    ("seq too big", {"seq": 100_001, "wake_at": True}),
    ("empty step id", {"step_id": "", "wake_at": True}),
    ("long step id", {"step_id": "x" * 201, "wake_at": True}),
    ("control in step id", {"step_id": "a\nb", "wake_at": True}),
    ("empty event name", {"event": ""}),
    ("control in event name", {"event": "a\x01b"}),
    ("long event name", {"event": "e" * 201}),
    ("negative timeout", {"event": "e", "timeout": -1}),
    ("zero timeout", {"event": "e", "timeout": 0}),
    ("huge timeout", {"event": "e", "timeout": 400 * 86400}),
    ("wake_at out of range", {"wake_at_seconds": 10**12}),
    ("child not a uuid", {"child": "nope"}),
    ("child waits not here yet", {"child": str(uuid.uuid4())}),
    ("bad run id", {"run_id": "x", "wake_at": True}),
    ("bad token", {"lease_token": "x", "wake_at": True}),
]


@pytest.mark.parametrize(("what", "spec"), HOSTILE_WAITS, ids=[h[0] for h in HOSTILE_WAITS])
def test_hostile_waits_are_invalid_arguments_and_write_nothing(
    cyclone_server: Any, what: str, spec: dict[str, Any]
) -> None:
    submit(cyclone_server, workflow("h", node("a")))
    step = one(cyclone_server)
    request = worker_service_pb2.WaitRequest(
        run_id=spec.get("run_id", step.run_id),
        node=step.node,
        lease_token=spec.get("lease_token", step.lease_token),
        step_id=spec.get("step_id", "w"),
        seq=spec.get("seq", 1),
    )
    if spec.get("wake_at"):
        request.wake_at.CopyFrom(ts(server_now(cyclone_server)))
    if "wake_at_seconds" in spec:
        request.wake_at.seconds = spec["wake_at_seconds"]
    if "event" in spec:
        request.event.name = spec["event"]
        if "timeout" in spec:
            request.event.timeout.CopyFrom(seconds(spec["timeout"]))
    if "child" in spec:
        request.child_run_id = spec["child"]
    err = rpc_error(cyclone_server.workers.Wait, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, err.details())
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_calls")[0][0] == 0
    assert get_run(cyclone_server, step.run_id).steps[0].status == types_pb2.STEP_STATUS_RUNNING


def test_hostile_events_are_invalid_arguments(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("h", node("a")))
    for name, key in [("", ""), ("a\x00b", ""), ("n" * 201, ""), ("ok", "k" * 201), ("ok", "\x07")]:
        err = rpc_error(send_event, cyclone_server, run_id, name, key=key)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, key)
    err = rpc_error(send_event, cyclone_server, "not-a-uuid", "ok")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    err = rpc_error(send_event, cyclone_server, run_id, "ok", deep)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.events")[0][0] == 0


def test_actions_of_the_server_are_reserved(cyclone_server: Any) -> None:
    err = rpc_error(claim, cyclone_server, "cyclone.event")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(submit, cyclone_server, workflow("r", node("a", "cyclone.event")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = node("a", "work")
    bad.event.name = "go"
    err = rpc_error(submit, cyclone_server, workflow("r", bad))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def event_node(name: str, event: str, timeout: float | None = None) -> types_pb2.Node:
    n = types_pb2.Node(name=name)
    n.event.name = event
    if timeout is not None:
        n.event.timeout.CopyFrom(seconds(timeout))
    return n


def test_a_dag_event_node_completes_with_the_payload(cyclone_server: Any) -> None:
    wf = workflow("approve", event_node("approval", "approved"), node("ship", deps=["approval"]))
    run_id = submit(cyclone_server, wf)
    eventually(
        lambda: get_run(cyclone_server, run_id).steps[0].waiting_for == "event approved",
        "the event node to wait",
    )
    send_event(cyclone_server, run_id, "approved", {"by": "ann"})
    ship = claim(cyclone_server, wait=PATIENCE)
    assert [s.node for s in ship] == ["ship"]
    assert (
        json.loads(
            json.dumps(ship[0].upstream_outputs["approval"].struct_value.fields["by"].string_value)
        )
        == "ann"
    )
    complete(cyclone_server, ship[0])
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "completed"
    assert [c.function for c in run.steps[0].journal] == ["cyclone.event"]


def test_a_dag_event_node_that_times_out_is_discarded_and_compensation_runs(
    cyclone_server: Any,
) -> None:
    wf = workflow(
        "approve",
        event_node("approval", "approved", timeout=0.5),
        node("ship", deps=["approval"]),
        node("refund", deps=["approval"], rule="one_failed"),
    )
    run_id = submit(cyclone_server, wf)
    steps = claim(cyclone_server, wait=PATIENCE)
    assert [s.node for s in steps] == ["refund"]
    run = get_run(cyclone_server, run_id)
    assert statuses(run)["approval"] == "discarded" and statuses(run)["ship"] == "skipped"
    assert run.steps[0].errors[-1].type == "EventTimeout"
    assert steps[0].upstream_failures[0].error.type == "EventTimeout"


# About 30,000 transitions in the engine: half a minute on a quiet machine, more when
# the cores are shared; make test-all runs it.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ten_thousand_sleeping_runs_finish_with_one_worker_slot(cyclone_server: Any) -> None:
    """10,000 runs each sleep 1s once, served by a single slot that takes one step at a
    time (claim, Wait, and Complete once the sleep is over), in the engine itself: every
    run completes with one resume, the slot never holding a sleeping node. The clock is
    moved instead of slept, so that the test takes seconds."""
    runs = 10_000
    nodes = json.dumps(
        [
            {
                "name": "nap",
                "action": "sleepy",
                "depends_on": [],
                "trigger_rule": "all_success",
                "max_attempts": 1,
                "initial_backoff_s": 1,
                "max_backoff_s": 1,
                "backoff_multiplier": 2,
                "timeout_s": 60,
                "input": None,
                "dependents": [],
                "position": 0,
            }
        ]
    )
    one_slot = """
    DO $$
    DECLARE
        c      record;
        w      record;
        done   integer := 0;
        asleep integer := 0;
        most   integer := 0;
        turns  integer := 0;
    BEGIN
        LOOP
            turns := turns + 1;
            IF turns > 30000 THEN
                RAISE EXCEPTION 'one slot is stuck: % of % runs finished', done, %(runs)s;
            END IF;
            -- Committed as a worker's calls would be, so that the claims' index walk
            -- does not wade through this block's own dead row versions.
            IF mod(turns, 100) = 0 THEN
                COMMIT;
            END IF;
            SELECT * INTO c FROM cyclone.step_claim('one-slot', ARRAY['sleepy'], '{}', 1,
                                                   interval '30 seconds');
            IF NOT FOUND THEN
                EXIT WHEN done = %(runs)s;
                -- Nothing due: sleep until the next wake time.
                UPDATE cyclone.clock SET offset_by = offset_by + interval '1 second';
                CONTINUE;
            END IF;
            SELECT * INTO w FROM cyclone.step_wait(
                c.run_id, c.node, c.lease_token, 'sleep', 1, 'cyclone.sleep',
                cyclone.now() + interval '1 second', NULL, NULL, NULL);
            IF w.decision = 'ready' THEN
                PERFORM cyclone._step_complete(c.run_id, c.node, c.lease_token, 'null');
                done := done + 1;
                asleep := asleep - 1;
            ELSE
                asleep := asleep + 1;
                most := greatest(most, asleep);
            END IF;
        END LOOP;
        IF most <> %(runs)s THEN
            RAISE EXCEPTION 'at most % runs slept at once', most;
        END IF;
    END;
    $$
    """
    with psycopg.connect(cyclone_server.database_url, autocommit=True) as conn:
        conn.execute(
            "SELECT cyclone.run_submit(gen_random_uuid(), 'sleepy', NULL, NULL, %s::jsonb)"
            " FROM generate_series(1, %s)",
            (nodes, runs),
        )
        conn.execute(one_slot.replace("%(runs)s", str(runs)).encode())
        counts = conn.execute(
            "SELECT r.status, s.attempt, s.resumes, count(*) FROM cyclone.runs r"
            " JOIN cyclone.steps s USING (run_id) GROUP BY 1, 2, 3"
        ).fetchall()
    assert counts == [("completed", 2, 1, runs)]


def test_explain_says_what_a_waiting_node_waits_for(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("x", node("a")))
    step = one(cyclone_server)
    cyclone_server.workers.Wait(wait_request(step, "e", event="approved"))
    why = cyclone_server.workflows.Explain(
        workflow_service_pb2.ExplainRequest(run_id=run_id, node="a")
    )
    assert why.reason == workflow_service_pb2.EXPLAIN_REASON_WAITING
    assert why.message.startswith("waiting for event approved with no time limit")
    assert why.message.endswith("resumed 0 time(s) so far")
    assert why.step.waiting == "event" and not why.step.HasField("waiting_until")
    assert f"cyclone event send {run_id} approved" in why.message


ENGINE_REFUSALS = [
    ("unknown function", "x.sleep", "now()", None, None),
    ("sleep without a time", "cyclone.sleep", "NULL", None, None),
    ("sleep until infinity", "cyclone.sleep", "'infinity'", None, None),
    ("event without a name", "cyclone.event", "NULL", None, None),
    ("event name with a control character", "cyclone.event", "NULL", "a\x01", None),
    ("negative timeout", "cyclone.event", "NULL", "e", "-1 second"),
    ("child without a run", "cyclone.child", "NULL", None, None),
]


@pytest.mark.parametrize(
    ("what", "function", "wake_at", "event", "timeout"),
    ENGINE_REFUSALS,
    ids=[r[0] for r in ENGINE_REFUSALS],
)
def test_the_engine_refuses_hostile_waits_with_cy004(
    cyclone_server: Any,
    what: str,
    function: str,
    wake_at: str,
    event: str | None,
    timeout: str | None,
) -> None:
    submit(cyclone_server, workflow("h", node("a")))
    step = one(cyclone_server)
    with pytest.raises(psycopg.Error) as info:
        cyclone_server.sql(
            f"SELECT * FROM cyclone.step_wait(%s, %s, %s, 'w', 1, %s, {wake_at}, %s,"
            " CAST(%s AS interval), NULL)",
            step.run_id,
            step.node,
            step.lease_token,
            function,
            event,
            timeout,
        )
    assert info.value.sqlstate == "CY004", what
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_calls")[0][0] == 0


def test_a_step_id_recorded_for_another_wait_is_refused(cyclone_server: Any) -> None:
    submit(cyclone_server, workflow("h", node("a")))
    step = one(cyclone_server)
    wake = server_now(cyclone_server) + dt.timedelta(seconds=60)
    cyclone_server.workers.Wait(wait_request(step, "w", wake_at=wake))
    step = (cyclone_server.advance_clock(61), one(cyclone_server))[1]
    err = rpc_error(cyclone_server.workers.Wait, wait_request(step, "w", event="other"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "recorded as cyclone.sleep" in (err.details() or "")


def test_an_event_sent_through_another_server_wakes_a_claim_waiting_on_this_one(
    server_factory: Any,
) -> None:
    a, b = server_factory(), server_factory()
    run_id = submit(a, workflow("two_servers", node("n"), event_node("gate", "open")))
    step = one(a)
    assert a.workers.Wait(wait_request(step, "e", event="open")).decision == SUSPENDED
    # One event for the body, one for the DAG node: each is consumed once.
    send_event(b, run_id, "open", "first")
    send_event(b, run_id, "open", "second")
    resumed = claim(a, wait=PATIENCE)
    assert [s.node for s in resumed] == ["n"]
    answer = a.workers.Wait(wait_request(resumed[0], "e", event="open"))
    assert answer.decision == READY
    complete(a, resumed[0], answer.call.output.string_value)
    run = eventually(
        lambda: (r := get_run(b, run_id)) and run_status(r) == "completed" and r,
        "the run to complete",
    )
    outputs = {s.node: s.output.string_value for s in run.steps}
    assert sorted(outputs.values()) == ["first", "second"]
