"""Concurrency key templates are evaluated by every path that creates a run: Submit,
SubmitOnce, a schedule's firing (and its catch-up firings), StartChild and the SDK's
start_child. One table of cases runs against each of them; each case reads the key
the run's step got (Step.concurrency_key in GetRun), or the refusal, and that a
refused call wrote nothing. Then: children of different customers under a key with
limit 1 run at once, and schedules stored with key templates (by a server that kept
them as written) get their keys evaluated before they fire again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from cyclone.v1 import schedule_service_pb2 as schedule_pb
from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from pyclient import Client, RetryPolicy, Worker, Workflow, start_child
from service.migrate import migrate
from tests.helpers import (
    claim,
    get_run,
    node,
    seconds,
    submit,
    table_counts,
    value,
    workflow,
)
from tests.sdk.conftest import running


@dataclass(frozen=True)
class Case:
    name: str
    #: The node's concurrency key template (None: the node has no key).
    template: str | None
    run_input: Any
    node_input: Any = None
    #: The key the step gets; or, when ``refused`` is set, a part of the
    #: INVALID_ARGUMENT message that refuses the run instead.
    key: str = ""
    refused: str = ""


CASES = [
    Case("a field", "customer:{run.customer_id}", {"customer_id": 42}, key="customer:42"),
    Case(
        "nested fields",
        "region:{run.address.country}/{run.address.zip}",
        {"address": {"country": "FR", "zip": "75001"}},
        key="region:FR/75001",
    ),
    Case(
        "a node input field",
        "shard:{node.shard}:{run.customer_id}",
        {"customer_id": "c7"},
        node_input={"shard": 3},
        key="shard:3:c7",
    ),
    Case("escaped braces", "{{literal}}", None, key="{literal}"),
    Case(
        "a missing field",
        "customer:{run.customer_id}",
        {"customer": 42},
        refused="{run.customer_id} is missing from the run input",
    ),
    Case(
        "no input",
        "customer:{run.customer_id}",
        None,
        refused="{run.customer_id} is missing from the run input",
    ),
    Case(
        "a NUL in the key",
        "a\x00{run.customer_id}",
        {"customer_id": 1},
        refused="concurrency key contains a NUL character",
    ),
    Case("no key", None, {"customer_id": 42}, key=""),
]


class Refused(Exception):
    """A path refused the run: the gRPC status's name and its message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def keyed_workflow(case: Case, name: str = "keyed", limit: int = 5) -> types_pb2.Workflow:
    n = node("n", "kid_work", input=case.node_input)
    if case.template is not None:
        n.concurrency.key = case.template
        n.concurrency.limit = limit
    return workflow(name, n)


def _called(method: Any, request: Any, run_input: Any = None) -> Any:
    """``method(request)``, ``run_input`` set as the request's ``input`` when given; a
    gRPC error as Refused."""
    if run_input is not None:
        request.input.CopyFrom(value(run_input))
    try:
        return method(request)
    except grpc.RpcError as exc:
        raise Refused(exc.code().name, exc.details() or "") from None


def runs_of(server: Any, wf: str = "keyed") -> list[str]:
    rows = server.sql("SELECT run_id FROM cyclone.runs WHERE workflow = %s", wf)
    return [str(r) for (r,) in rows]


# The entry points: each creates runs of ``wf`` with ``run_input`` and returns their
# ids, or raises Refused.


def via_submit(server: Any, wf: types_pb2.Workflow, run_input: Any) -> list[str]:
    request = workflow_service_pb2.SubmitRequest(workflow=wf)
    return [_called(server.workflows.Submit, request, run_input).run_id]


def via_submit_once(server: Any, wf: types_pb2.Workflow, run_input: Any) -> list[str]:
    request = workflow_service_pb2.SubmitOnceRequest(workflow=wf, key="order-1")
    return [_called(server.workflows.SubmitOnce, request, run_input).run_id]


def _create_schedule(
    server: Any, wf: types_pb2.Workflow, run_input: Any, catch_up: int, name: str = "tick"
) -> None:
    s = schedule_pb.Schedule(
        name=name, workflow=wf, overlap=schedule_pb.OVERLAP_POLICY_ALLOW, catch_up=catch_up
    )
    s.interval.CopyFrom(seconds(60))
    if run_input is not None:
        s.input.CopyFrom(value(run_input))
    _called(server.schedules.CreateSchedule, schedule_pb.CreateScheduleRequest(schedule=s))


def _past_next_firing(server: Any, name: str, then: float = 0) -> None:
    """The engine's clock moved just past the schedule's next fire time plus ``then``."""
    [(due, now)] = server.sql(
        "SELECT next_fire_at, cyclone.now() FROM cyclone.schedules WHERE name = %s", name
    )
    server.advance_clock((due - now).total_seconds() + then + 0.01)


def via_schedule(server: Any, wf: types_pb2.Workflow, run_input: Any) -> list[str]:
    _create_schedule(server, wf, run_input, schedule_pb.CATCH_UP_POLICY_SKIP)
    _past_next_firing(server, "tick")
    assert server.fire_schedules() == 1
    return runs_of(server)


def via_catch_up(server: Any, wf: types_pb2.Workflow, run_input: Any) -> list[str]:
    """Four firings missed (the server was away three intervals past the first), all
    made up in one pass."""
    _create_schedule(server, wf, run_input, schedule_pb.CATCH_UP_POLICY_ALL)
    _past_next_firing(server, "tick", then=180)
    assert server.fire_schedules() == 4
    return runs_of(server)


def via_start_child(server: Any, wf: types_pb2.Workflow, run_input: Any) -> list[str]:
    """A parent run's step is claimed; StartChild with its lease."""
    submit(server, workflow("parent", node("body", "work")))
    [step] = claim(server, "work")
    request = worker_service_pb2.StartChildRequest(
        run_id=step.run_id,
        node=step.node,
        lease_token=step.lease_token,
        step_id="child",
        seq=1,
        workflow=wf,
    )
    return [_called(server.workers.StartChild, request, run_input).child_run_id]


def via_sdk_start_child(server: Any, wf: types_pb2.Workflow, run_input: Any) -> list[str]:
    """A durable function of a real Worker starts the child (pyclient.start_child)."""
    worker = Worker(
        server.address, concurrency=1, lease=10.0, claim_wait=1.0, reconnect_max_delay=0.5
    )

    @worker.workflow("parent")
    def parent(ctx: Any) -> str:
        return start_child(wf, run_input).run_id

    once = Workflow("parent")
    once.node("parent", retry=RetryPolicy(max_attempts=1))
    with Client(server.address) as client, running(worker):
        run = client.wait(client.submit(once), timeout=20)
    step = run.step("parent")
    if run.status == "failed":
        error = step.last_error
        assert error is not None, run
        raise Refused(error.type, error.message)
    assert run.status == "completed", run
    return [step.output]


ENTRIES: dict[str, Callable[[Any, types_pb2.Workflow, Any], list[str]]] = {
    "Submit": via_submit,
    "SubmitOnce": via_submit_once,
    "schedule firing": via_schedule,
    "catch-up firings": via_catch_up,
    "StartChild": via_start_child,
    "SDK start_child": via_sdk_start_child,
}
#: The status a refusal has: the SDK records it as the body's error type.
REFUSED_AS = {"SDK start_child": "InvalidArgument"}


def _writes(server: Any) -> dict[str, int]:
    """Counts of what a run's creation writes: runs and their rows, SubmitOnce keys,
    schedules, step calls."""
    counts = table_counts(server)
    for table in ("schedules", "step_calls"):
        counts[table] = server.sql(f"SELECT count(*) FROM cyclone.{table}")[0][0]
    return counts


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_every_path_that_creates_a_run_evaluates_its_key(
    cyclone_server: Any, entry: str, case: Case
) -> None:
    server = cyclone_server
    wf = keyed_workflow(case)
    if not case.refused:
        run_ids = ENTRIES[entry](server, wf, case.run_input)
        assert run_ids and sorted(run_ids) == sorted(runs_of(server))
        for run_id in run_ids:
            [step] = get_run(server, run_id).steps
            assert step.concurrency_key == case.key
        return
    before = _writes(server)
    with pytest.raises(Refused) as refused:
        ENTRIES[entry](server, wf, case.run_input)
    assert refused.value.code == REFUSED_AS.get(entry, "INVALID_ARGUMENT")
    assert case.refused in refused.value.message
    assert runs_of(server) == []
    after = _writes(server)
    if entry == "StartChild":
        # The parent run and its claimed step are the test's; nothing else is written.
        assert after["step_calls"] == 0 and after["runs"] == before["runs"] + 1
    elif entry == "SDK start_child":
        assert after["step_calls"] == 0 and after["schedules"] == 0
    else:
        assert after == before


def test_children_of_different_customers_run_at_once_under_a_key_with_limit_one(
    cyclone_server: Any,
) -> None:
    """Two children of workflow "keyed" (key customer:{run.customer_id}, limit 1), for
    customers 1 and 2, and a third for customer 1: a claim gets one step of each
    customer."""
    server = cyclone_server
    wf = keyed_workflow(CASES[0], limit=1)
    children = {}
    for customer in (1, 2, 1):
        [child] = via_start_child(server, wf, {"customer_id": customer})
        children[child] = customer
    claimed = claim(server, "kid_work", n=10)
    assert sorted(children[s.run_id] for s in claimed) == [1, 2]
    assert sorted(get_run(server, s.run_id).steps[0].concurrency_key for s in claimed) == [
        "customer:1",
        "customer:2",
    ]


# Schedules stored with key templates ----------------------------------------------


def _as_stored_before(server: Any) -> None:
    """Make the database what a server that stored key templates as written left: its
    schedules' nodes hold the templates of their workflows, and it lacks the migration
    that marks them. Then migrate it, as a newer server does at start."""
    server.sql(
        """UPDATE cyclone.schedules s
              SET nodes = (SELECT jsonb_agg(
                                      CASE WHEN n ? 'concurrency_key' AND
                                                n ->> 'concurrency_key' IS NOT NULL
                                           THEN jsonb_set(n, '{concurrency_key}',
                                                          w -> 'concurrency' -> 'key')
                                           ELSE n END ORDER BY (n ->> 'position')::int)
                             FROM jsonb_array_elements(s.nodes) n
                             JOIN jsonb_array_elements(s.workflow -> 'nodes') w
                               ON w ->> 'name' = n ->> 'name')"""
    )
    server.sql("ALTER TABLE cyclone.schedules DROP COLUMN nodes_keyed")
    server.sql("DELETE FROM cyclone.schema_migrations WHERE version = 46")
    assert migrate(server.database_url) == [46]


def test_a_schedule_stored_with_key_templates_gets_its_keys_before_it_fires_again(
    cyclone_server: Any,
) -> None:
    """Three schedules: keyed with an input that has the field, keyed with one that
    lacks it (a server that kept templates accepted it), and without a key. After the
    upgrade the first fires with its key evaluated and stored; the second cannot fire
    and stays due, submitting nothing; the third fires as before."""
    server = cyclone_server
    keyed = keyed_workflow(CASES[0])
    _create_schedule(server, keyed, {"customer_id": 42}, schedule_pb.CATCH_UP_POLICY_SKIP, "good")
    _create_schedule(server, keyed, {"customer_id": 7}, schedule_pb.CATCH_UP_POLICY_SKIP, "bad")
    plain = keyed_workflow(CASES[-1], name="plain")
    _create_schedule(server, plain, None, schedule_pb.CATCH_UP_POLICY_SKIP, "plain")
    # The input a server that did not evaluate keys would have taken.
    server.sql("UPDATE cyclone.schedules SET input = '{\"customer\": 7}' WHERE name = 'bad'")
    _as_stored_before(server)
    assert server.sql(
        "SELECT name, nodes_keyed, nodes -> 0 ->> 'concurrency_key' FROM cyclone.schedules "
        "ORDER BY name"
    ) == [
        ("bad", False, "customer:{run.customer_id}"),
        ("good", False, "customer:{run.customer_id}"),
        ("plain", True, None),
    ]
    [(due_bad,)] = server.sql("SELECT next_fire_at FROM cyclone.schedules WHERE name = 'bad'")

    _past_next_firing(server, "good")
    assert server.fire_schedules() == 2  # good and plain: all three were due at once
    [good] = runs_of(server)
    assert get_run(server, good).steps[0].concurrency_key == "customer:42"
    assert server.sql(
        "SELECT name, nodes_keyed, nodes -> 0 ->> 'concurrency_key', next_fire_at > %s "
        "FROM cyclone.schedules ORDER BY name",
        due_bad,
    ) == [
        ("bad", False, "customer:{run.customer_id}", False),
        ("good", True, "customer:42", True),
        ("plain", True, None, True),
    ]
    assert server.sql(
        "SELECT count(*) FROM cyclone.runs WHERE submit_key LIKE %s", "schedule:bad:%"
    ) == [(0,)]

    # The next firing of the good one submits its stored nodes as they are now.
    _past_next_firing(server, "good")
    server.fire_schedules()
    assert sorted(get_run(server, r).steps[0].concurrency_key for r in runs_of(server)) == [
        "customer:42",
        "customer:42",
    ]


def test_create_schedule_stores_the_key_evaluated_and_a_refusal_leaves_the_name_free(
    cyclone_server: Any,
) -> None:
    server = cyclone_server
    wf = keyed_workflow(CASES[0])
    with pytest.raises(Refused):
        _create_schedule(server, wf, {"customer": 1}, schedule_pb.CATCH_UP_POLICY_SKIP)
    _create_schedule(server, wf, {"customer_id": 1}, schedule_pb.CATCH_UP_POLICY_SKIP)
    assert server.sql(
        "SELECT nodes_keyed, nodes -> 0 ->> 'concurrency_key' FROM cyclone.schedules"
    ) == [(True, "customer:1")]
    # GetSchedule shows the workflow as it was given.
    got = server.schedules.GetSchedule(schedule_pb.GetScheduleRequest(name="tick")).schedule
    assert got.workflow.nodes[0].concurrency.key == "customer:{run.customer_id}"
