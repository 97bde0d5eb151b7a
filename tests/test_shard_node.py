"""ClaimRequest.shard_node and WorkOpen.shard_node on a database that is not
distributed: no node holds a part of the runs, so a claim that names one is refused,
saying so, and takes nothing (a worker pinned to a node is a Citus deployment's; the
pinning itself is tested on a cluster, tests/citus/test_pinned.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cyclone.v1 import worker_service_pb2 as worker_pb
from pyclient import Worker
from pyclient.errors import InvalidArgument
from tests.helpers import node, rpc_error, submit, workflow


def _claim(server: Any, shard_node: str) -> worker_pb.ClaimResponse:
    return server.workers.Claim(
        worker_pb.ClaimRequest(
            worker_id="pinned",
            actions=[worker_pb.ActionSpec(name="work")],
            max_steps=5,
            shard_node=shard_node,
        )
    )


def _ready(server: Any) -> int:
    [(count,)] = server.sql("SELECT count(*) FROM cyclone.steps WHERE status = 'available'")
    return count


def test_a_claim_pinned_to_a_node_of_a_plain_database_is_refused(cyclone_server: Any) -> None:
    submit(cyclone_server, workflow("w", node("a")))
    error = rpc_error(_claim, cyclone_server, "worker-1:5432")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'worker-1:5432'" in error.details()
    assert "not distributed" in error.details()
    assert _ready(cyclone_server) == 1, "the refused claim took nothing"


def test_a_shard_node_too_long_is_refused(cyclone_server: Any) -> None:
    error = rpc_error(_claim, cyclone_server, "h" * 301)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard_node is 301 characters; the limit is 300" in error.details()


def test_a_work_stream_pinned_to_a_node_of_a_plain_database_is_refused(
    cyclone_server: Any,
) -> None:
    """The SDK's worker sends its shard_node on its stream; refused, it stops and says
    why instead of idling."""
    submit(cyclone_server, workflow("w", node("a")))
    worker = Worker(cyclone_server.address, shard_node="worker-1:5432", claim_wait=1.0)
    worker.register("work", lambda ctx: None)
    with pytest.raises(InvalidArgument, match="not distributed"):
        worker.run(handle_signals=False)
    assert _ready(cyclone_server) == 1


def test_the_shard_node_comes_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CYCLONE_SHARD_NODE", "worker-2:5432")
    assert Worker("127.0.0.1:1").shard_node == "worker-2:5432"
    assert Worker("127.0.0.1:1", shard_node="worker-1:5432").shard_node == "worker-1:5432"
    monkeypatch.delenv("CYCLONE_SHARD_NODE")
    assert Worker("127.0.0.1:1").shard_node is None
    with pytest.raises(InvalidArgument, match="shard_node must name a node"):
        Worker("127.0.0.1:1", shard_node=" ")
