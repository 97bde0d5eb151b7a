"""Claim, Heartbeat and Complete: the step life cycle and the crash-matrix rows that
need no process kill."""

from __future__ import annotations

import threading

import grpc
import pytest

from cyclone.v1 import types_pb2, worker_service_pb2
from tests.helpers import (
    claim,
    complete,
    drain,
    eventually,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    seconds,
    statuses,
    submit,
    table_counts,
    value,
    workflow,
)
from tests.test_metrics import scrape
from tests.test_metrics import value as metric


def heartbeat(server, step, lease=None, progress=None):
    request = worker_service_pb2.HeartbeatRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token
    )
    if lease is not None:
        request.lease.CopyFrom(seconds(lease))
    if progress is not None:
        request.progress.CopyFrom(value(progress))
    return server.workers.Heartbeat(request)


def test_chain_runs_in_order_and_completes_the_run(cyclone_server):
    run_id = submit(
        cyclone_server, workflow("chain", node("a"), node("b", deps=["a"]), node("c", deps=["b"]))
    )
    assert drain(cyclone_server) == ["a", "b", "c"]
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "completed"
    assert run.HasField("finished_at")
    assert set(statuses(run).values()) == {"completed"}


def test_diamond_join_waits_for_both_branches_and_sees_their_outputs(cyclone_server):
    submit(
        cyclone_server,
        workflow(
            "diamond",
            node("a"),
            node("b", deps=["a"]),
            node("c", deps=["a"]),
            node("d", deps=["b", "c"]),
        ),
    )
    [a] = claim(cyclone_server)
    complete(cyclone_server, a, {"from": "a"})
    b, c = sorted(claim(cyclone_server), key=lambda s: s.node)
    assert (b.node, c.node) == ("b", "c")
    assert b.upstream_outputs["a"].struct_value["from"] == "a"
    complete(cyclone_server, b, {"from": "b"})
    assert claim(cyclone_server) == []  # d still waits for c
    complete(cyclone_server, c, {"from": "c"})
    [d] = claim(cyclone_server)
    assert d.node == "d"
    assert set(d.upstream_outputs) == {"b", "c"}


def test_claim_hands_out_only_the_actions_the_worker_serves(cyclone_server):
    submit(cyclone_server, workflow("w", node("a", action="email"), node("b", action="charge")))
    [step] = claim(cyclone_server, "charge")
    assert step.action == "charge"
    assert [s.action for s in claim(cyclone_server, "email", "sms")] == ["email"]


def test_claim_returns_at_most_max_steps(cyclone_server):
    submit(cyclone_server, workflow("w", *[node(f"n{i}") for i in range(7)]))
    assert len(claim(cyclone_server, n=3)) == 3
    assert len(claim(cyclone_server, n=10)) == 4


def test_claimed_step_carries_input_run_input_attempt_and_lease(cyclone_server):
    run_id = submit(
        cyclone_server, workflow("w", node("a", input={"amount": 5})), input={"order": 1}
    )
    [step] = claim(cyclone_server, lease=10)
    assert step.run_id == run_id and step.node == "a" and step.workflow == "w"
    assert step.attempt == 1 and step.max_attempts == 3
    assert step.input.struct_value["amount"] == 5
    assert step.run_input.struct_value["order"] == 1
    assert len(step.lease_token) == 36
    lease = step.lease_expires_at.ToDatetime() - step.deadline.ToDatetime()
    assert lease.total_seconds() < 0  # the lease ends before the deadline


def test_concurrent_claims_never_hand_out_a_step_twice(cyclone_server):
    submit(cyclone_server, workflow("w", *[node(f"n{i}") for i in range(200)]))
    got: list[str] = []
    lock = threading.Lock()

    def worker(i):
        while steps := claim(cyclone_server, n=7, worker=f"w{i}"):
            with lock:
                got.extend(s.node for s in steps)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(f"n{i}" for i in range(200))


#: Settings of a server whose waiting claims a test watches on its metrics endpoint.
WATCHED = {"metrics_listen": "127.0.0.1:0"}


def waiting_claims(server) -> float:
    """The server's gauge of claims long-polling for work, as Prometheus reads it."""
    return metric(scrape(server.server.metrics_port), "cyclone_claims_waiting")


def claim_in_thread(server, action: str) -> tuple[threading.Thread, list]:
    """A Claim of ``action`` waiting up to 30 s, in a thread, once it is waiting."""
    result: list = []
    seen_waiting = threading.Event()

    def run() -> None:
        while True:
            try:
                result.extend(claim(server, action, wait=30))
                return
            except grpc.RpcError as error:
                # A pooled connection that a Postgres restart broke fails once. Not
                # retried once the claim was seen waiting: the retry's first look
                # would find the step with no wake-up at all.
                if error.code() != grpc.StatusCode.UNAVAILABLE or seen_waiting.is_set():
                    raise

    waiter = threading.Thread(target=run)
    waiter.start()
    eventually(lambda: waiting_claims(server) == 1, "the claim to wait")
    seen_waiting.set()
    return waiter, result


@pytest.mark.parametrize("submitted_to", ["the same server", "another server"])
def test_waiting_claim_is_woken_by_a_submit(server_factory, submitted_to):
    # The periodic re-check is pushed out of reach: only the wake-up (in this server,
    # or by NOTIFY from the other) can end the wait before the claim's 30 s.
    waiting = server_factory(claim_recheck_s=3600, **WATCHED)
    submitting = waiting if submitted_to == "the same server" else server_factory()
    waiter, result = claim_in_thread(waiting, "late")
    run_id = submit(submitting, workflow("w", node("a", action="late")))
    waiter.join(20)
    assert not waiter.is_alive()
    assert [(s.run_id, s.node) for s in result] == [(run_id, "a")]


def test_a_waiting_claim_is_woken_across_servers_after_postgres_drops_them(server_factory):
    """What a Postgres restart does to the servers' connections (each is terminated),
    done to this test's database alone: the first notification sent afterwards still
    reaches a claim waiting on the other server."""
    waiting = server_factory(claim_recheck_s=3600, **WATCHED)
    submitting = server_factory(claim_recheck_s=3600)
    # Both servers have used their NOTIFY connections before the restart.
    submit(submitting, workflow("w", node("warm", action="warm")))
    submit(waiting, workflow("w", node("warm", action="warm")))
    listeners = waiting.sql(LISTENERS)
    waiting.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    # The waiting server listens again on a new connection.
    eventually(
        lambda: {pid for (pid,) in waiting.sql(LISTENERS)} - {pid for (pid,) in listeners},
        "the LISTEN connection to come back",
    )
    eventually(lambda: waiting.server.dispatcher.connected.is_set(), "the listener")
    waiter, result = claim_in_thread(waiting, "late")
    run_id = None
    while run_id is None:
        try:
            run_id = submit(submitting, workflow("w", node("a", action="late")))
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
    waiter.join(20)
    assert not waiter.is_alive(), "the claim was not woken: the notification was lost"
    assert [(s.run_id, s.node) for s in result] == [(run_id, "a")]


LISTENERS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
)


def test_claim_with_nothing_ready_returns_empty_after_its_wait(cyclone_server):
    assert claim(cyclone_server, "nothing", wait=0.2) == []


def test_success_stores_the_output(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [step] = claim(cyclone_server)
    reply = complete(cyclone_server, step, {"charge_id": "ch_1"})
    assert reply.status == types_pb2.STEP_STATUS_COMPLETED
    assert reply.run_status == types_pb2.RUN_STATUS_COMPLETED
    run = get_run(cyclone_server, run_id)
    assert run.steps[0].output.struct_value["charge_id"] == "ch_1"


def test_repeated_complete_with_the_same_token_returns_the_recorded_result(cyclone_server):
    submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    [step] = claim(cyclone_server)
    first = complete(cyclone_server, step, {"v": 1})
    again = complete(cyclone_server, step, {"v": 2})
    assert not first.duplicate and again.duplicate
    assert again.status == types_pb2.STEP_STATUS_COMPLETED
    [b] = claim(cyclone_server)
    assert b.upstream_outputs["a"].struct_value["v"] == 1  # the first output stands


def test_stale_token_is_refused_and_changes_nothing(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [step] = claim(cyclone_server)
    forged = worker_service_pb2.ClaimedStep()
    forged.CopyFrom(step)
    forged.lease_token = "00000000-0000-4000-8000-000000000000"
    before = cyclone_server.sql("SELECT * FROM cyclone.steps WHERE run_id = %s", run_id)
    error = rpc_error(complete, cyclone_server, forged, {"x": 1})
    assert error.code() == grpc.StatusCode.ABORTED
    assert "lease lost" in error.details()
    assert cyclone_server.sql("SELECT * FROM cyclone.steps WHERE run_id = %s", run_id) == before
    complete(cyclone_server, step)  # the real holder still can


def test_retryable_failure_backs_off_then_runs_again_with_the_next_attempt(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a", backoff=60)))
    [step] = claim(cyclone_server)
    reply = fail(cyclone_server, step, "flaky")
    assert reply.status == types_pb2.STEP_STATUS_AVAILABLE
    assert reply.run_status == types_pb2.RUN_STATUS_RUNNING
    delay = (reply.retry_at.ToDatetime() - step.lease_expires_at.ToDatetime()).total_seconds()
    assert claim(cyclone_server) == []  # not before the backoff
    cyclone_server.advance_clock(61)
    [again] = claim(cyclone_server)
    assert (again.run_id, again.node, again.attempt) == (run_id, "a", 2)
    assert again.lease_token != step.lease_token
    assert delay < 60  # jitter takes up to half of the backoff off
    run = get_run(cyclone_server, run_id)
    [error] = run.steps[0].errors
    assert (error.attempt, error.message, error.type, error.retryable) == (
        1,
        "flaky",
        "RuntimeError",
        True,
    )


def test_backoff_grows_and_stays_under_the_maximum(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a", backoff=1, max_attempts=10)))
    cyclone_server.sql(
        "UPDATE cyclone.steps SET max_backoff = '8 seconds' WHERE run_id = %s", run_id
    )
    delays = []
    for _ in range(6):
        [step] = claim(cyclone_server)
        [(before,)] = cyclone_server.sql("SELECT cyclone.now()")
        reply = fail(cyclone_server, step)
        delays.append((reply.retry_at.ToDatetime(tzinfo=before.tzinfo) - before).total_seconds())
        cyclone_server.advance_clock(9)
    # attempt n waits between half and all of min(8, 2 ** (n - 1)) seconds
    for n, d in enumerate(delays, start=1):
        full = min(8, 2 ** (n - 1))
        assert full / 2 - 0.5 <= d <= full + 0.5, (n, d)


def test_retry_after_overrides_the_backoff(cyclone_server):
    submit(cyclone_server, workflow("w", node("a", backoff=3600)))
    [step] = claim(cyclone_server)
    fail(cyclone_server, step, retry_after=0)
    [again] = claim(cyclone_server)
    assert again.attempt == 2


def test_out_of_attempts_discards_skips_dependents_and_fails_the_run(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow(
            "w",
            node("a", max_attempts=2, backoff=0),
            node("b", deps=["a"]),
            node("c", deps=["b"]),
            node("side", action="other"),
        ),
    )
    for attempt in (1, 2):
        step = next(s for s in claim(cyclone_server) if s.node == "a")
        assert step.attempt == attempt
        reply = fail(cyclone_server, step)
    assert reply.status == types_pb2.STEP_STATUS_DISCARDED
    assert reply.run_status == types_pb2.RUN_STATUS_RUNNING  # "side" is still open
    [side] = claim(cyclone_server, "other")
    complete(cyclone_server, side)
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"a": "discarded", "b": "skipped", "c": "skipped", "side": "completed"}
    assert run_status(run) == "failed"
    assert run.error.kind == "StepDiscarded" and run.error.node == "a"
    assert run.error.attempt == 2


def test_non_retryable_failure_discards_at_once(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a", max_attempts=5)))
    [step] = claim(cyclone_server)
    reply = fail(cyclone_server, step, "card declined", non_retryable=True)
    assert reply.status == types_pb2.STEP_STATUS_DISCARDED
    assert reply.run_status == types_pb2.RUN_STATUS_FAILED
    assert get_run(cyclone_server, run_id).steps[0].errors[0].retryable is False


def test_expired_lease_is_reclaimed_with_the_next_attempt(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [first] = claim(cyclone_server, lease=5)
    assert cyclone_server.sweep() == 0  # not expired yet
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    [second] = claim(cyclone_server)
    assert (second.run_id, second.node, second.attempt) == (run_id, "a", 2)
    assert second.effect_uncertain  # the first attempt may have had its effect
    # The first worker wakes up: its completion and heartbeat are refused.
    assert rpc_error(complete, cyclone_server, first).code() == grpc.StatusCode.ABORTED
    assert rpc_error(heartbeat, cyclone_server, first).code() == grpc.StatusCode.ABORTED
    complete(cyclone_server, second)
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "completed"
    assert [e.kind for e in run.steps[0].errors] == ["lease_expired"]


def test_lease_expired_completion_is_refused_even_before_the_sweep(cyclone_server):
    submit(cyclone_server, workflow("w", node("a")))
    [step] = claim(cyclone_server, lease=5)
    cyclone_server.advance_clock(6)
    error = rpc_error(complete, cyclone_server, step)
    assert error.code() == grpc.StatusCode.ABORTED
    assert dict(error.trailing_metadata())["cyclone-current-attempt"] == "1"


def test_a_step_that_runs_out_its_timeout_at_every_attempt_is_discarded_after_the_last(
    cyclone_server,
):
    # The lease runs to the deadline (timeout 5 s): a timeout, which counts as an attempt
    # (a lease that lapses before the deadline lost its worker, which does not).
    run_id = submit(cyclone_server, workflow("w", node("a", max_attempts=3, timeout=5)))
    for attempt in (1, 2, 3):
        [step] = claim(cyclone_server, lease=5)
        assert step.attempt == attempt
        cyclone_server.advance_clock(6)
        assert cyclone_server.sweep() == 1
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"a": "discarded"}
    assert run_status(run) == "failed"
    assert claim(cyclone_server) == []


def test_heartbeat_extends_the_lease_but_never_past_the_timeout(cyclone_server):
    submit(cyclone_server, workflow("w", node("a", timeout=20)))
    [step] = claim(cyclone_server, lease=5)
    for _ in range(3):
        cyclone_server.advance_clock(4)
        reply = heartbeat(cyclone_server, step, lease=5, progress={"done": 3})
        assert not reply.cancelled
    assert cyclone_server.sweep() == 0  # kept alive past the first lease
    cyclone_server.advance_clock(4)
    reply = heartbeat(cyclone_server, step, lease=5)
    assert reply.lease_expires_at.ToDatetime() == step.deadline.ToDatetime()  # capped
    cyclone_server.advance_clock(5)
    assert rpc_error(heartbeat, cyclone_server, step).code() == grpc.StatusCode.ABORTED
    assert cyclone_server.sweep() == 1
    [again] = claim(cyclone_server)
    assert again.attempt == 2
    assert again.progress.struct_value["done"] == 3  # resume from progress


def test_cancel_reaches_the_heartbeat_and_refuses_the_completion(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    [step] = claim(cyclone_server)
    cyclone_server.workflows.CancelRun(
        __import__("cyclone.v1.workflow_service_pb2", fromlist=["x"]).CancelRunRequest(
            run_id=run_id, reason="customer asked"
        )
    )
    assert heartbeat(cyclone_server, step).cancelled
    assert rpc_error(complete, cyclone_server, step).code() == grpc.StatusCode.ABORTED
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "cancelled"
    assert statuses(run) == {"a": "cancelled", "b": "cancelled"}
    assert claim(cyclone_server) == []


def test_complete_validates_its_input(cyclone_server):
    submit(cyclone_server, workflow("w", node("a")))
    [step] = claim(cyclone_server)
    before = table_counts(cyclone_server)
    cases = [
        (
            worker_service_pb2.CompleteRequest(
                run_id="nope", node="a", lease_token=step.lease_token, output=value(1)
            ),
            "run_id 'nope' is not a UUID",
        ),
        (
            worker_service_pb2.CompleteRequest(
                run_id=step.run_id, node="a", lease_token="x", output=value(1)
            ),
            "lease_token 'x' is not a UUID",
        ),
        (
            worker_service_pb2.CompleteRequest(
                run_id=step.run_id, node="a", lease_token=step.lease_token
            ),
            "outcome is required",
        ),
    ]
    for request, message in cases:
        error = rpc_error(cyclone_server.workers.Complete, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.details()
    unknown = worker_service_pb2.CompleteRequest(
        run_id=step.run_id, node="ghost", lease_token=step.lease_token, output=value(1)
    )
    assert rpc_error(cyclone_server.workers.Complete, unknown).code() == grpc.StatusCode.NOT_FOUND
    assert table_counts(cyclone_server) == before


def test_claim_validates_its_input(cyclone_server):
    cases = [
        (
            worker_service_pb2.ClaimRequest(actions=[worker_service_pb2.ActionSpec(name="a")]),
            "worker_id is required",
        ),
        (worker_service_pb2.ClaimRequest(worker_id="w"), "at least one action"),
        (
            worker_service_pb2.ClaimRequest(
                worker_id="w", max_steps=5000, actions=[worker_service_pb2.ActionSpec(name="a")]
            ),
            "max_steps must be between 1 and 1000",
        ),
        (
            worker_service_pb2.ClaimRequest(
                worker_id="w", wait=seconds(3600), actions=[worker_service_pb2.ActionSpec(name="a")]
            ),
            "wait must be between",
        ),
        (
            worker_service_pb2.ClaimRequest(
                worker_id="w", actions=[worker_service_pb2.ActionSpec(name="bad name")]
            ),
            "action name 'bad name' is invalid",
        ),
    ]
    for request, message in cases:
        error = rpc_error(cyclone_server.workers.Claim, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert message in error.details()


def test_the_background_sweep_reclaims_a_lost_lease_and_wakes_a_waiting_claim(server_factory):
    # The test never sweeps itself, and the claim's periodic re-check is out of reach:
    # only the server's own sweep and its notification end the wait.
    server = server_factory(sweep_interval_s=0.05, claim_recheck_s=3600, **WATCHED)
    submit(server, workflow("w", node("a")))
    [step] = claim(server, lease=5, worker="lost-worker")
    waiter, result = claim_in_thread(server, "work")  # waiting before the lease ends
    server.advance_clock(6)
    waiter.join(20)
    assert not waiter.is_alive(), "the claim was not woken by the sweep"
    [again] = result
    assert (again.node, again.attempt) == (step.node, 2)


def complete_many(server, *completions):
    return server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(completions=list(completions))
    ).results


def completion(step, output=None, failure=None):
    request = worker_service_pb2.CompleteRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token
    )
    if failure is not None:
        request.failure.CopyFrom(failure)
    else:
        request.output.CopyFrom(value(output))
    return request


def test_complete_many_applies_each_outcome_and_reports_each_in_request_order(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow("w", node("a"), node("b", backoff=60), node("c"), node("d", deps=["a"])),
    )
    steps = {s.node: s for s in claim(cyclone_server)}
    stale = worker_service_pb2.ClaimedStep()
    stale.CopyFrom(steps["c"])
    stale.lease_token = "00000000-0000-4000-8000-000000000000"
    results = complete_many(
        cyclone_server,
        completion(steps["a"], {"v": "a"}),
        completion(steps["b"], failure=worker_service_pb2.Failure(message="flaky")),
        completion(stale, {"v": "forged"}),
        completion(steps["a"], {"v": "again"}),
    )
    assert [r.WhichOneof("result") for r in results] == [
        "response",
        "response",
        "error",
        "response",
    ]
    assert results[0].response.status == types_pb2.STEP_STATUS_COMPLETED
    assert results[1].response.status == types_pb2.STEP_STATUS_AVAILABLE
    assert results[1].response.HasField("retry_at")
    assert results[2].error.code == grpc.StatusCode.ABORTED.value[0]
    assert "lease lost" in results[2].error.message
    assert results[2].error.current_attempt == 1
    assert results[3].response.duplicate
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"a": "completed", "b": "available", "c": "running", "d": "available"}
    assert run.steps[0].output.struct_value["v"] == "a"
    complete(cyclone_server, steps["c"])  # the refused item changed nothing


def test_complete_many_refuses_an_invalid_item_and_writes_nothing(cyclone_server):
    submit(cyclone_server, workflow("w", node("a"), node("b")))
    a, b = claim(cyclone_server)
    before = cyclone_server.sql("SELECT * FROM cyclone.steps ORDER BY node")
    bad = worker_service_pb2.CompleteRequest(
        run_id=b.run_id, node=b.node, lease_token="x", output=value(1)
    )
    error = rpc_error(complete_many, cyclone_server, completion(a, 1), bad)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "completions[1]: lease_token 'x' is not a UUID" in error.details()
    assert cyclone_server.sql("SELECT * FROM cyclone.steps ORDER BY node") == before
    error = rpc_error(complete_many, cyclone_server)
    assert "must hold 0 to 1000 items each, at least one in all" in error.details()


def test_complete_many_checks_each_item_past_the_names_it_has_seen(cyclone_server):
    # The server remembers node names it found valid and takes canonical ids at a
    # glance: an item with a bad name is still refused after good ones, and ids in
    # upper case still go through the full check and are accepted.
    submit(cyclone_server, workflow("w", node("a"), node("b")))
    a, b = claim(cyclone_server)
    before = cyclone_server.sql("SELECT * FROM cyclone.steps ORDER BY node")
    bad = worker_service_pb2.CompleteRequest(
        run_id=b.run_id, node="no such/node", lease_token=b.lease_token, output=value(1)
    )
    error = rpc_error(complete_many, cyclone_server, completion(a, 1), bad)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("completions[1]: ")
    assert cyclone_server.sql("SELECT * FROM cyclone.steps ORDER BY node") == before
    upper = worker_service_pb2.CompleteRequest(
        run_id=b.run_id.upper(), node=b.node, lease_token=b.lease_token.upper(), output=value(2)
    )
    results = complete_many(cyclone_server, completion(a, 1), upper)
    assert [r.response.status for r in results] == [types_pb2.STEP_STATUS_COMPLETED] * 2


def test_complete_many_across_runs_completes_each_run(cyclone_server):
    run_ids = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(20)]
    steps = claim(cyclone_server, n=20)
    results = complete_many(cyclone_server, *[completion(s, {"i": i}) for i, s in enumerate(steps)])
    assert all(r.response.run_status == types_pb2.RUN_STATUS_COMPLETED for r in results)
    done = cyclone_server.sql("SELECT count(*) FROM cyclone.runs WHERE status = 'completed'")
    assert done == [(len(run_ids),)]


def test_complete_many_settles_a_fan_out_that_finishes_in_one_batch(cyclone_server):
    leaves = [f"leaf{i}" for i in range(4)]
    run_id = submit(
        cyclone_server,
        workflow(
            "fan",
            node("root"),
            *[node(leaf, deps=["root"], max_attempts=1) for leaf in leaves],
            node("join", deps=leaves),
            node("after_join", deps=["join"]),
            node("compensate", deps=leaves, rule="one_failed"),
            node("always", deps=leaves, rule="all_done"),
        ),
    )
    [root] = claim(cyclone_server)
    complete(cyclone_server, root)
    taken = sorted(claim(cyclone_server), key=lambda s: s.node)
    assert [s.node for s in taken] == leaves
    failure = worker_service_pb2.Failure(message="no", type="E", non_retryable=True)
    results = complete_many(
        cyclone_server,
        *[completion(s, {"leaf": s.node}) for s in taken[:3]],
        completion(taken[3], failure=failure),
        completion(taken[0], {"leaf": "again"}),
    )
    assert [r.response.status for r in results] == [types_pb2.STEP_STATUS_COMPLETED] * 3 + [
        types_pb2.STEP_STATUS_DISCARDED,
        types_pb2.STEP_STATUS_COMPLETED,
    ]
    assert [r.response.duplicate for r in results] == [False, False, False, False, True]
    assert {r.response.run_status for r in results} == {types_pb2.RUN_STATUS_RUNNING}
    # The failed leaf skips the join and, in the same walk, what follows the join.
    assert statuses(get_run(cyclone_server, run_id)) == {
        "root": "completed",
        **{leaf: "completed" for leaf in leaves[:3]},
        "leaf3": "discarded",
        "join": "skipped",
        "after_join": "skipped",
        "compensate": "available",
        "always": "available",
    }
    last = claim(cyclone_server)
    assert sorted(s.node for s in last) == ["always", "compensate"]
    assert set(last[0].upstream_outputs) == set(leaves[:3])  # the completed ones only
    results = complete_many(cyclone_server, *[completion(s) for s in last])
    # Both items report the run as the batch left it: finished, failed by leaf3.
    assert [r.response.run_status for r in results] == [types_pb2.RUN_STATUS_FAILED] * 2
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "failed"
    assert "leaf3" in run.error.message
    assert cyclone_server.sql("SELECT steps_open FROM cyclone.runs WHERE run_id = %s", run_id) == [
        (0,)
    ]


def test_steps_a_cancelled_claim_took_are_handed_back_as_they_were(cyclone_server):
    import asyncio
    from types import SimpleNamespace

    from service.db import Database

    run_id = submit(cyclone_server, workflow("w", node("a"), node("b")))
    first = claim(cyclone_server, "work", lease=5)
    # b lost a lease once: its uncertainty must survive the hand-back.
    cyclone_server.advance_clock(6)
    cyclone_server.sweep()
    taken = claim(cyclone_server, "work")
    assert {s.node: s.attempt for s in taken} == {"a": 2, "b": 2}
    rows = [
        SimpleNamespace(
            run_id=s.run_id,
            node=s.node,
            lease_token=s.lease_token,
            effect_uncertain=s.effect_uncertain,
        )
        for s in taken
    ]

    async def release():
        store = Database(cyclone_server.database_url)
        try:
            return await store.steps.steps_release(rows)
        finally:
            await store.close()

    assert asyncio.run(release()) == 2
    again = {s.node: s for s in claim(cyclone_server, "work")}
    assert {n: s.attempt for n, s in again.items()} == {"a": 2, "b": 2}
    assert all(s.effect_uncertain for s in again.values())
    assert {s.run_id for s in first} == {run_id}
    # A stale hand-back (the steps were claimed again since) changes nothing.
    assert asyncio.run(release()) == 0
