"""Build pinning through the raw API (docs/durable-functions.md, "Build pinning"): a
node whose body has a journal goes only to workers of the build that started it, or of
one declared compatible; a worker without a build takes only unpinned nodes; a retired
build's workers get nothing, and its leftovers are listed and moved by an operator;
bad input changes nothing."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cyclone.v1 import admin_service_pb2 as admin_pb
from cyclone.v1 import worker_service_pb2
from tests.helpers import (
    complete,
    fail,
    get_run,
    node,
    rpc_error,
    statuses,
    submit,
    value,
    workflow,
)

ACTION = "body"


def claim(server: Any, build: str = "", worker: str = "") -> list[worker_service_pb2.ClaimedStep]:
    """One Claim of ACTION by a worker of ``build`` ("" for none)."""
    request = worker_service_pb2.ClaimRequest(
        worker_id=worker or f"w-{build or 'none'}",
        actions=[worker_service_pb2.ActionSpec(name=ACTION)],
        max_steps=10,
        build_id=build,
    )
    return list(server.workers.Claim(request, timeout=30).steps)


def journal(server: Any, step: Any, step_id: str = "one") -> None:
    """The body records a step call that succeeded: the node now has a journal."""
    server.workers.EndStepCall(
        worker_service_pb2.EndStepCallRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=step_id,
            seq=1,
            function=step_id,
            output=value(1),
        )
    )


def again(server: Any, step: Any) -> None:
    """The attempt fails and its backoff passes: the node is ready again."""
    fail(server, step)
    server.advance_clock(3600)


def started_on(server: Any, build: str, *, journaled: bool = True) -> Any:
    """A one-node run whose body a worker of ``build`` started (with a journal entry when
    ``journaled``) and whose attempt then failed: its node is ready for a retry."""
    run_id = submit(server, workflow("deploy", node("n", ACTION, max_attempts=10)))
    [step] = claim(server, build)
    assert step.run_id == run_id
    if journaled:
        journal(server, step)
    again(server, step)
    return step


def pin_of(server: Any, run_id: str) -> str:
    [step] = get_run(server, run_id).steps
    return step.build_id


def test_a_journaled_node_goes_only_to_its_build_until_another_is_declared_compatible(
    cyclone_server: Any,
) -> None:
    started = started_on(cyclone_server, "A")
    assert pin_of(cyclone_server, started.run_id) == "A"
    # B's workers, and workers without a build, are passed over; A's take it.
    assert claim(cyclone_server, "B") == []
    assert claim(cyclone_server, "") == []
    assert statuses(get_run(cyclone_server, started.run_id)) == {"n": "available"}
    [again_a] = claim(cyclone_server, "A", worker="w-a2")
    assert again_a.attempt == 2
    again(cyclone_server, again_a)

    build = cyclone_server.admin.SetBuildCompatible(
        admin_pb.SetBuildCompatibleRequest(build_id="B", compatible_with="A")
    ).build
    assert build.build_id == "B" and list(build.compatible) == ["A", "B"]
    [taken] = claim(cyclone_server, "B")
    assert taken.attempt == 3
    assert [c.step_id for c in taken.journal] == ["one"]
    # The node stays on the build that started its body.
    assert pin_of(cyclone_server, started.run_id) == "A"
    complete(cyclone_server, taken, "done")
    assert statuses(get_run(cyclone_server, started.run_id)) == {"n": "completed"}


def test_a_node_without_a_journal_goes_to_any_build_and_takes_the_new_one(
    cyclone_server: Any,
) -> None:
    started = started_on(cyclone_server, "A", journaled=False)
    assert pin_of(cyclone_server, started.run_id) == "A"
    [step] = claim(cyclone_server, "B")
    assert pin_of(cyclone_server, started.run_id) == "B"
    again(cyclone_server, step)
    # A worker without a build may take it too: then it is unpinned.
    [step] = claim(cyclone_server, "")
    assert pin_of(cyclone_server, started.run_id) == ""


def test_a_worker_without_a_build_takes_only_unpinned_nodes_and_leaves_them_unpinned(
    cyclone_server: Any,
) -> None:
    pinned = started_on(cyclone_server, "A")
    free = submit(cyclone_server, workflow("plain", node("n", ACTION, max_attempts=10)))
    [step] = claim(cyclone_server, "")
    assert step.run_id == free
    journal(cyclone_server, step)
    again(cyclone_server, step)
    assert pin_of(cyclone_server, free) == ""
    # The unpinned journaled node goes to a worker without a build again, never the
    # pinned one.
    [step] = claim(cyclone_server, "")
    assert step.run_id == free
    assert pin_of(cyclone_server, free) == ""
    assert statuses(get_run(cyclone_server, pinned.run_id)) == {"n": "available"}


def test_a_retired_build_is_listed_with_its_runs_and_its_nodes_move_to_another(
    cyclone_server: Any,
) -> None:
    started = started_on(cyclone_server, "A")
    claim(cyclone_server, "B")  # B is declared (and finds nothing it may take)
    listed = {
        b.build_id: b for b in cyclone_server.admin.ListBuilds(admin_pb.ListBuildsRequest()).builds
    }
    assert set(listed) == {"A", "B"}
    assert (listed["A"].pinned_nodes, listed["A"].pinned_runs, listed["A"].retired) == (1, 1, False)
    assert [w.worker_id for w in listed["A"].workers] == ["w-A"]
    assert listed["B"].pinned_nodes == 0

    retired = cyclone_server.admin.RetireBuild(
        admin_pb.RetireBuildRequest(build_id="A", reason="B deployed")
    ).build
    assert retired.retired and retired.HasField("retired_at")
    assert claim(cyclone_server, "A") == []  # a retired build's workers get nothing
    runs = cyclone_server.admin.ListBuildRuns(admin_pb.ListBuildRunsRequest(build_id="A")).runs
    assert [(r.run_id, r.workflow, list(r.nodes)) for r in runs] == [
        (started.run_id, "deploy", ["n"])
    ]

    moved = cyclone_server.admin.MoveBuild(
        admin_pb.MoveBuildRequest(from_build_id="A", to_build_id="B", reason="leftovers")
    )
    assert (moved.nodes_moved, moved.runs_moved) == (1, 1)
    assert pin_of(cyclone_server, started.run_id) == "B"
    audit = [(a.action, a.reason) for a in get_run(cyclone_server, started.run_id).audit]
    assert ("build_move", "leftovers") in audit
    [taken] = claim(cyclone_server, "B")
    assert taken.run_id == started.run_id
    again_moved = cyclone_server.admin.MoveBuild(
        admin_pb.MoveBuildRequest(from_build_id="A", to_build_id="B")
    )
    assert (again_moved.nodes_moved, again_moved.runs_moved) == (0, 0)


def builds_state(server: Any) -> list[tuple[Any, ...]]:
    return server.sql(
        "SELECT b.build_id, b.set_id, b.retired_at IS NOT NULL,"
        " (SELECT array_agg(s.build_id ORDER BY s.run_id) FROM cyclone.steps s)"
        " FROM cyclone.builds b ORDER BY 1"
    ) + server.sql("SELECT count(*) FROM cyclone.audit")


@pytest.mark.parametrize(
    ("call", "request_", "code"),
    [
        ("RetireBuild", admin_pb.RetireBuildRequest(build_id="nope"), grpc.StatusCode.NOT_FOUND),
        ("RetireBuild", admin_pb.RetireBuildRequest(), grpc.StatusCode.INVALID_ARGUMENT),
        (
            "RetireBuild",
            admin_pb.RetireBuildRequest(build_id="x" * 201),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "SetBuildCompatible",
            admin_pb.SetBuildCompatibleRequest(build_id="B", compatible_with="nope"),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            "SetBuildCompatible",
            admin_pb.SetBuildCompatibleRequest(build_id="B", compatible_with="B"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "SetBuildCompatible",
            admin_pb.SetBuildCompatibleRequest(build_id="B\n", compatible_with="A"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "MoveBuild",
            admin_pb.MoveBuildRequest(from_build_id="A", to_build_id="B"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (
            "MoveBuild",
            admin_pb.MoveBuildRequest(from_build_id="A", to_build_id="nope"),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            "ListBuildRuns",
            admin_pb.ListBuildRunsRequest(build_id="nope"),
            grpc.StatusCode.NOT_FOUND,
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    cyclone_server: Any, call: str, request_: Any, code: grpc.StatusCode
) -> None:
    started_on(cyclone_server, "A")
    claim(cyclone_server, "B")
    before = builds_state(cyclone_server)
    error = rpc_error(getattr(cyclone_server.admin, call), request_)
    assert error.code() == code, error.details()
    assert builds_state(cyclone_server) == before


@pytest.mark.parametrize("build", ["x" * 201, "a\tb", "line\nbreak", "\x00"])
def test_a_claim_with_an_invalid_build_is_refused_and_takes_nothing(
    cyclone_server: Any, build: str
) -> None:
    run_id = submit(cyclone_server, workflow("deploy", node("n", ACTION)))
    error = rpc_error(claim, cyclone_server, build)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "build id" in (error.details() or "")
    assert statuses(get_run(cyclone_server, run_id)) == {"n": "available"}
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.builds") == [(0,)]
