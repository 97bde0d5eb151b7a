"""ListRuns and CountRuns by run id prefix, workflow prefix and key prefix, and paged
both ways (prev_page_token: newer runs); ListSteps of an action's ready steps;
ListWorkers' idle workers; against a real server."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from cyclone.v1 import types_pb2
from cyclone.v1 import worker_service_pb2 as K
from cyclone.v1 import workflow_service_pb2 as W
from tests.helpers import claim, node, rpc_error, submit, workflow


def submit_once(server: Any, name: str, key: str) -> str:
    request = W.SubmitOnceRequest(workflow=workflow(name, node("a")), key=key)
    return str(server.workflows.SubmitOnce(request).run_id)


def listed(server: Any, **fields: Any) -> list[str]:
    return [r.run_id for r in server.workflows.ListRuns(W.ListRunsRequest(**fields)).runs]


def test_a_run_id_prefix_finds_the_runs_whose_id_starts_with_it(cyclone_server: Any) -> None:
    ids = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(3)]
    target = ids[1]
    assert listed(cyclone_server, run_id_prefix=target) == [target]
    assert listed(cyclone_server, run_id_prefix=target.replace("-", "").upper()) == [target]
    # UUIDv7 ids of runs made together share their first digits (the time).
    assert set(listed(cyclone_server, run_id_prefix=target[:6])) == set(ids)
    other = "0" if target[0] != "0" else "1"
    assert listed(cyclone_server, run_id_prefix=other) == []
    error = rpc_error(cyclone_server.workflows.ListRuns, W.ListRunsRequest(run_id_prefix="xyz"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hex digits" in error.details()


def test_workflow_and_key_prefixes_match_the_start_of_names_and_keys(cyclone_server: Any) -> None:
    a = submit_once(cyclone_server, "orders.eu", "cart-1")
    b = submit_once(cyclone_server, "orders.us", "cart-2")
    c = submit_once(cyclone_server, "reports", "cart_3")
    d = submit_once(cyclone_server, "orders", "carts%4")
    assert set(listed(cyclone_server, workflow_prefix="orders")) == {a, b, d}
    assert set(listed(cyclone_server, workflow_prefix="orders.")) == {a, b}
    assert listed(cyclone_server, workflow_prefix="zz") == []
    assert set(listed(cyclone_server, key_prefix="cart-")) == {a, b}
    # LIKE's wildcards in a prefix are plain characters.
    assert set(listed(cyclone_server, key_prefix="cart_")) == {c}
    assert set(listed(cyclone_server, key_prefix="carts%")) == {d}
    assert set(listed(cyclone_server, key_prefix="cart")) == {a, b, c, d}
    assert listed(cyclone_server, workflow_prefix="orders", key_prefix="cart_") == []
    counted = cyclone_server.workflows.CountRuns(
        W.CountRunsRequest(workflow_prefix="orders.", key_prefix="cart")
    )
    assert sum(c.count for c in counted.counts) == 2


def test_pages_go_to_older_runs_and_back_to_newer_ones(cyclone_server: Any) -> None:
    ids = [submit(cyclone_server, workflow("paged", node("a"))) for _ in range(7)]
    newest_first = ids[::-1]

    def page(token: str = "") -> W.ListRunsResponse:
        request = W.ListRunsRequest(workflow="paged", page_size=3, page_token=token)
        return cyclone_server.workflows.ListRuns(request)

    first = page()
    assert [r.run_id for r in first.runs] == newest_first[:3]
    assert first.next_page_token and not first.prev_page_token
    second = page(first.next_page_token)
    assert [r.run_id for r in second.runs] == newest_first[3:6]
    assert second.prev_page_token and second.next_page_token
    last = page(second.next_page_token)
    assert [r.run_id for r in last.runs] == newest_first[6:]
    assert not last.next_page_token and last.prev_page_token
    back = page(last.prev_page_token)
    assert [r.run_id for r in back.runs] == newest_first[3:6]
    assert back.next_page_token and back.prev_page_token
    front = page(back.prev_page_token)
    assert [r.run_id for r in front.runs] == newest_first[:3]
    assert front.next_page_token and not front.prev_page_token


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"workflow_prefix": "x" * 129}, "at most 128"),
        ({"key_prefix": "k" * 257}, "at most 256"),
        ({"run_id_prefix": "0" * 33}, "hex digits"),
    ],
)
def test_bad_prefixes_are_refused_with_the_reason(
    cyclone_server: Any, fields: dict[str, str], says: str
) -> None:
    for call, request in (
        (cyclone_server.workflows.ListRuns, W.ListRunsRequest(**fields)),
        (cyclone_server.workflows.CountRuns, W.CountRunsRequest(**fields)),
    ):
        error = rpc_error(call, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in error.details()


def test_ready_steps_of_an_action_are_listed_longest_ready_first(cyclone_server: Any) -> None:
    first = submit(cyclone_server, workflow("w", node("a", action="slow")))
    second = submit(cyclone_server, workflow("w", node("a", action="slow")))
    submit(cyclone_server, workflow("w", node("a", action="other")))
    request = W.ListStepsRequest(ready=True, action="slow", page_size=1)
    page = cyclone_server.workflows.ListSteps(request)
    assert [s.run_id for s in page.steps] == [first]
    assert page.next_page_token
    request.page_token = page.next_page_token
    assert [s.run_id for s in cyclone_server.workflows.ListSteps(request).steps] == [second]
    claim(cyclone_server, "slow", n=1)
    left = cyclone_server.workflows.ListSteps(W.ListStepsRequest(ready=True, action="slow"))
    assert [s.run_id for s in left.steps] == [second]


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"ready": True}, "needs an action"),
        ({"ready": True, "action": "a", "backing_off": True}, "cannot be combined"),
        ({"ready": True, "action": "a", "status": types_pb2.STEP_STATUS_RUNNING}, "cannot be"),
    ],
)
def test_ready_needs_an_action_and_no_other_kind(
    cyclone_server: Any, fields: dict[str, Any], says: str
) -> None:
    error = rpc_error(cyclone_server.workflows.ListSteps, W.ListStepsRequest(**fields))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


def test_list_workers_shows_a_worker_that_asked_for_work_and_got_none(cyclone_server: Any) -> None:
    request = K.ClaimRequest(
        worker_id="idle-7", actions=[K.ActionSpec(name="b"), K.ActionSpec(name="a")], build_id="b1"
    )
    assert not cyclone_server.workers.Claim(request).steps
    [worker] = cyclone_server.workflows.ListWorkers(W.ListWorkersRequest()).workers
    assert (worker.worker_id, worker.running, worker.build_id) == ("idle-7", 0, "b1")
    assert list(worker.serves) == ["a", "b"]
    assert worker.HasField("last_seen_at") and not worker.unhealthy
    [(actions, build)] = cyclone_server.sql(
        "SELECT actions, build_id FROM cyclone.workers_seen WHERE worker_id = 'idle-7'"
    )
    assert (actions, build) == (["a", "b"], "b1")


def test_the_cli_lists_runs_by_prefix_and_says_when_more_match(
    cyclone_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyclient import Client, cli

    a = submit_once(cyclone_server, "billing.eu", "inv-1")
    b = submit_once(cyclone_server, "billing.us", "inv-2")
    submit_once(cyclone_server, "reports", "inv-3")
    with Client(cyclone_server.address) as client:

        def run_ids(*flags: str) -> list[str]:
            argv = ["runs", "list", "--json", *flags]
            assert cli.main(argv, client=client) == 0
            return [r["run_id"] for r in json.loads(capsys.readouterr().out)]

        assert run_ids("--workflow-prefix", "billing.") == [b, a]
        assert run_ids("--key-prefix", "inv-", "--workflow-prefix", "billing.eu") == [a]
        assert run_ids("--run-id", a.replace("-", "")) == [a]
        assert run_ids("--since", "1h", "--workflow-prefix", "bill") == [b, a]
        assert run_ids("--until", "2000-01-01T00:00:00Z") == []
        # A list cut at --limit says that more match, and how to see them.
        assert (
            cli.main(
                ["runs", "list", "--workflow-prefix", "billing.", "--limit", "1"], client=client
            )
            == 0
        )
        captured = capsys.readouterr()
        assert b[:8] in captured.out and a[:8] not in captured.out
        assert (
            "1 runs shown, newest first; more match (raise --limit, or add --until" in captured.err
        )
        # A bad prefix is a clear refusal, not an empty list.
        assert cli.main(["runs", "list", "--run-id", "xyz"], client=client) == 1
        assert "hex digits" in capsys.readouterr().err
