"""Workflow definitions: the builder, client-side validation, the protobuf form."""

from __future__ import annotations

import datetime as dt

import pytest

from cyclone.jsonvalue import from_value
from cyclone.v1 import types_pb2
from pyclient import InvalidArgument, RetryPolicy, Workflow, dag


def order_workflow() -> Workflow:
    wf = Workflow("order")
    charge = wf.node("charge", timeout=30, retry=RetryPolicy(max_attempts=5))
    receipt = wf.node("receipt", action="send_receipt", depends_on=[charge])
    wf.node("audit", depends_on=receipt, trigger_rule="all_done", input={"level": "info"})
    return wf


def test_builder_names_dependencies_by_node_or_name_and_defaults_action_to_node_name():
    wf = order_workflow()
    assert [(n.name, n.action, n.depends_on) for n in wf.nodes] == [
        ("charge", "charge", ()),
        ("receipt", "send_receipt", ("charge",)),
        ("audit", "audit", ("receipt",)),
    ]


def test_proto_carries_every_setting_and_leaves_unset_ones_to_the_server():
    p = order_workflow().to_proto()
    charge, receipt, audit = p.nodes
    assert p.name == "order"
    assert charge.timeout.seconds == 30
    assert charge.retry.max_attempts == 5
    assert not charge.retry.HasField("initial_backoff")
    assert charge.retry.backoff_multiplier == 0
    assert not receipt.HasField("timeout")
    assert list(receipt.depends_on) == ["charge"]
    assert receipt.trigger_rule == types_pb2.TRIGGER_RULE_ALL_SUCCESS
    assert audit.trigger_rule == types_pb2.TRIGGER_RULE_ALL_DONE
    assert from_value(audit.input) == {"level": "info"}
    assert not receipt.HasField("input")


def test_durations_accept_seconds_and_timedeltas():
    wf = Workflow("w")
    retry = RetryPolicy(initial_backoff=dt.timedelta(milliseconds=250), max_backoff=2)
    node = wf.node("a", timeout=dt.timedelta(minutes=2), retry=retry)
    assert (node.timeout, node.retry.initial_backoff, node.retry.max_backoff) == (120.0, 0.25, 2.0)
    p = wf.to_proto().nodes[0]
    assert p.retry.initial_backoff.nanos == 250_000_000
    assert p.timeout.seconds == 120


def _server_message(name: str, nodes: list[dag.NodeSpec]) -> str:
    with pytest.raises(dag.InvalidWorkflow) as info:
        dag.validate_workflow(name, nodes)
    return str(info.value)


@pytest.mark.parametrize(
    ("build", "specs"),
    [
        (
            lambda wf: wf.node("a", depends_on=["ghost"]),
            [dag.NodeSpec("a", "a", depends_on=("ghost",))],
        ),
        (
            lambda wf: (wf.node("a", depends_on=["b"]), wf.node("b", depends_on=["a"])),
            [dag.NodeSpec("a", "a", ("b",)), dag.NodeSpec("b", "b", ("a",))],
        ),
        (lambda wf: (wf.node("a"), wf.node("a")), [dag.NodeSpec("a", "a")] * 2),
        (lambda wf: wf.node("bad name"), [dag.NodeSpec("bad name", "bad name")]),
        (
            lambda wf: wf.node("a", retry=RetryPolicy(max_attempts=0)),
            [dag.NodeSpec("a", "a", max_attempts=0)],
        ),
        (
            lambda wf: wf.node("a", retry=RetryPolicy(max_backoff=0.5)),
            [dag.NodeSpec("a", "a", max_backoff_s=0.5)],
        ),
        (lambda wf: wf.node("a", timeout=0.1), [dag.NodeSpec("a", "a", timeout_s=0.1)]),
        (
            lambda wf: wf.node("a", trigger_rule="sometimes"),
            [dag.NodeSpec("a", "a", trigger_rule="sometimes")],
        ),
        (lambda wf: None, []),
    ],
    ids=[
        "unknown-dependency",
        "cycle",
        "duplicate",
        "bad-name",
        "attempts",
        "backoff-below-default-initial",
        "timeout",
        "trigger-rule",
        "no-nodes",
    ],
)
def test_invalid_workflows_fail_before_the_network_with_the_servers_message(build, specs):
    wf = Workflow("order")
    build(wf)
    with pytest.raises(InvalidArgument) as info:
        wf.to_proto()
    assert str(info.value) == _server_message("order", specs)


def test_input_that_is_not_json_is_refused_with_the_node_named():
    wf = Workflow("w")
    wf.node("a", input={"when": dt.datetime(2024, 1, 1)})
    with pytest.raises(InvalidArgument, match="node 'a': input is not JSON"):
        wf.to_proto()


def test_from_dict_builds_the_same_workflow_as_the_builder():
    wf = Workflow.from_dict(
        {
            "name": "order",
            "nodes": [
                {"name": "charge", "timeout": 30, "retry": {"max_attempts": 5}},
                {"name": "receipt", "action": "send_receipt", "depends_on": ["charge"]},
                {
                    "name": "audit",
                    "depends_on": "receipt",
                    "trigger_rule": "all_done",
                    "input": {"level": "info"},
                },
            ],
        }
    )
    assert wf.to_proto() == order_workflow().to_proto()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a mapping"),
        ({"nodes": []}, "needs a 'name'"),
        ({"name": "w"}, "needs a 'nodes' list"),
        ({"name": "w", "nodes": [{"action": "x"}]}, "node #1 must be a mapping with a 'name'"),
        ({"name": "w", "nodes": [{"name": "a", "after": []}]}, "node 'a': unknown field 'after'"),
        (
            {"name": "w", "nodes": [{"name": "a", "retry": {"tries": 2}}]},
            "node 'a': retry: unknown field 'tries'",
        ),
    ],
)
def test_from_dict_names_what_is_wrong(data, message):
    with pytest.raises(InvalidArgument, match=message):
        Workflow.from_dict(data)


def test_from_dict_takes_priority_and_concurrency():
    wf = Workflow.from_dict(
        {
            "name": "w",
            "nodes": [
                {"name": "a", "priority": 3, "concurrency": {"key": "c:{run.id}", "limit": 2}},
                {"name": "b", "depends_on": ["a"]},
            ],
        }
    )
    a, b = wf.to_proto().nodes
    assert (a.priority, a.concurrency.key, a.concurrency.limit) == (3, "c:{run.id}", 2)
    assert (b.HasField("priority"), b.HasField("concurrency")) == (False, False)
    with pytest.raises(InvalidArgument, match="unknown field 'keys'"):
        Workflow.from_dict({"name": "w", "nodes": [{"name": "a", "concurrency": {"keys": "x"}}]})
    with pytest.raises(InvalidArgument, match="concurrency limit must be between"):
        Workflow.from_dict(
            {"name": "w", "nodes": [{"name": "a", "concurrency": {"key": "x", "limit": 0}}]}
        ).validate()
