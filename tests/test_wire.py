"""service.api.wire writes Claim answers as bytes: each must parse to the very message the
protobuf Python API builds from the same row (no database needed)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from cyclone.v1 import types_pb2, worker_service_pb2
from service.api import build, wire
from service.db import pool as store
from service.db.records import ClaimedStep

JSON_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    -0.0,
    2**53,
    -(2**60),
    1e300,
    math.inf,
    "",
    'é ☃ 😀 \\ " \n',
    "x" * 200,
    "y" * 20_000,
    {},
    [],
    {"customer": 17},
    {"": None, "é": [1, None, "c", {"d": [], "e": {}}], "f": {"g": False}},
    [[[[[]]]]],
    list(range(300)),
    {f"k{i}": i for i in range(200)},
]


def nested(depth: int) -> Any:
    obj: Any = "leaf"
    for i in range(depth):
        obj = {"n": obj} if i % 2 else [obj]
    return obj


def reference(obj: Any) -> struct_pb2.Value:
    """The Value of obj through the protobuf library's own JSON mapping."""
    value = struct_pb2.Value()
    if isinstance(obj, float) and math.isinf(obj):
        value.number_value = obj  # not JSON; the wire format holds it all the same
        return value
    return json_format.ParseDict(obj, value, max_recursion_depth=200)


@pytest.mark.parametrize("obj", [*JSON_VALUES, nested(40)], ids=repr)
def test_value_bytes_parse_to_the_value_the_api_builds(obj: Any) -> None:
    written = struct_pb2.Value.FromString(wire.value_bytes(obj))
    assert written == reference(obj)
    assert written.WhichOneof("kind") == reference(obj).WhichOneof("kind")


@pytest.mark.parametrize(
    "n", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31 - 1, 2**63 - 1, -1, -(2**31)]
)
def test_varint_is_protobufs(n: int) -> None:
    # An int64 field holding n serializes to its tag (one byte) and n's varint.
    ts = timestamp_pb2.Timestamp(seconds=n)
    expected = ts.SerializeToString()
    assert expected == (b"\x08" + wire.varint(n) if n else b"")


AT = datetime(2026, 12, 1, 5, 23, 3, 206171, tzinfo=UTC)


class Raw(str):
    """JSON text for row(), taken as it is."""


def row(**changes: Any) -> ClaimedStep:
    """A claimed row; run_input and upstream given as objects, held as the JSON text
    that the claim reads them as (None: SQL NULL; Raw("null") for a JSON null)."""
    for field in ("run_input", "upstream"):
        if changes.get(field) is not None and not isinstance(changes[field], Raw):
            changes[field] = json.dumps(changes[field], ensure_ascii=False)
    values: dict[str, Any] = dict(
        run_id="01a2300d-b5b3-7613-b271-c6a2ced52838",
        node="only",
        action="work",
        workflow="flow",
        attempt=1,
        max_attempts=3,
        input=None,
        run_input=None,
        upstream=None,
        lease_token="8244a996-91cc-4902-ab0c-54c1d0cac44d",
        lease_expires_at=AT,
        deadline_at=AT + timedelta(minutes=5),
        progress=None,
        effect_uncertain=False,
        blocked=False,
        waited_s=0.25,
        upstream_failures=None,
        journal=None,
        run_deadline=None,
        traceparent=None,
    )
    values.update(changes)
    return ClaimedStep(**values)


def built(r: ClaimedStep) -> worker_service_pb2.ClaimedStep:
    """The ClaimedStep of a row through the Python API, field by field."""
    step = worker_service_pb2.ClaimedStep(
        run_id=r.run_id,
        node=r.node,
        action=r.action,
        workflow=r.workflow,
        attempt=r.attempt,
        max_attempts=r.max_attempts,
        lease_token=r.lease_token,
        effect_uncertain=r.effect_uncertain,
    )
    step.lease_expires_at.FromDatetime(r.lease_expires_at)
    step.deadline.FromDatetime(r.deadline_at)
    run_input = None if r.run_input is None else json.loads(r.run_input)
    for field, obj in (("input", r.input), ("run_input", run_input), ("progress", r.progress)):
        if obj is not None:
            getattr(step, field).CopyFrom(reference(obj))
    for node, output in (json.loads(r.upstream) if r.upstream else {}).items():
        step.upstream_outputs[node].CopyFrom(reference(output))
    rare = build.rare_parts(r)
    if rare is not None:
        step.MergeFrom(rare)
    return step


ERROR = {
    "attempt": 2,
    "kind": "error",
    "type": "ValueError",
    "message": "bad ☃",
    "details": "trace",
    "retryable": True,
    "at": "2026-12-01T05:00:00+00:00",
}
JOURNAL = [
    {
        "step_id": "charge",
        "seq": 1,
        "function": "charge",
        "status": "succeeded",
        "unsafe": True,
        "output": {"id": 7},
        "error": None,
        "attempt": 1,
        "started_at": "2026-12-01T05:00:00+00:00",
        "finished_at": "2026-12-01T05:00:01.5+00:00",
        "wake_at": None,
        "waiting_for": None,
    }
]
ROWS = [
    row(),
    row(run_input={"customer": 17}),
    row(input=[1, "two", None], run_input="text", progress={"done": 0.5}),
    row(input=None, run_input=None, progress=False),
    row(attempt=200, max_attempts=1000, effect_uncertain=True),
    row(upstream={"a": {"x": 1}, "b": None, "c": [], "d.e:f-g": "s" * 300}),
    row(upstream={}),
    row(node="n" * 128, action="act.other", workflow="wf:2"),
    row(lease_expires_at=AT.replace(microsecond=0), deadline_at=AT.replace(microsecond=0)),
    row(
        lease_expires_at=datetime(1969, 7, 20, 20, 17, 40, 5, tzinfo=UTC),
        deadline_at=datetime(1970, 1, 1, tzinfo=UTC),
    ),
    row(
        upstream_failures=[
            {"node": "a", "status": "discarded", "error": ERROR},
            {"node": "b", "status": "skipped", "error": None},
        ]
    ),
    row(journal=JOURNAL, run_input={"deep": nested(30)}),
    row(run_deadline=AT, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    # A fan-out's leaves in one claim: the same upstream and run input (written once),
    # then another; and a run input of JSON null, written as none (as SQL NULL).
    row(node="leaf1", upstream={"root": [1, "☃"]}, run_input={"batch": 3}),
    row(node="leaf2", upstream={"root": [1, "☃"]}, run_input={"batch": 3}),
    row(node="leaf3", upstream={"root": None}, run_input=Raw("null")),
]


def test_a_claim_answer_parses_to_the_steps_the_api_builds() -> None:
    response = wire.claim_response(ROWS, build.rare_parts)
    assert list(response.steps) == [built(r) for r in ROWS]
    assert not response.blocked
    # Each field as a worker reads it, for a few.
    first, second = response.steps[0], response.steps[1]
    assert first.run_id == ROWS[0].run_id and first.lease_token == ROWS[0].lease_token
    assert first.HasField("lease_expires_at") and not first.HasField("run_input")
    assert second.run_input.struct_value.fields["customer"].number_value == 17
    assert response.steps[4].attempt == 200 and response.steps[4].effect_uncertain
    assert response.steps[8].lease_expires_at.nanos == 0
    assert response.steps[9].lease_expires_at.ToDatetime(UTC) == ROWS[9].lease_expires_at
    assert response.steps[9].HasField("deadline") and response.steps[9].deadline.seconds == 0
    assert [u.status for u in response.steps[10].upstream_failures] == [
        types_pb2.STEP_STATUS_DISCARDED,
        types_pb2.STEP_STATUS_SKIPPED,
    ]
    assert response.steps[11].journal[0].output.struct_value.fields["id"].number_value == 7
    leaf1, leaf2, leaf3 = response.steps[12:15]
    assert leaf1.upstream_outputs == leaf2.upstream_outputs
    assert leaf1.upstream_outputs["root"].list_value.values[1].string_value == "☃"
    assert leaf2.run_input.struct_value.fields["batch"].number_value == 3
    assert leaf3.upstream_outputs["root"].HasField("null_value")
    assert not leaf3.HasField("run_input")


def test_an_empty_claim_answer_is_empty() -> None:
    assert wire.claim_response([], build.rare_parts) == worker_service_pb2.ClaimResponse()


@pytest.mark.parametrize(
    "text",
    ['{"customer":17}', "null", '"s"', "[1,2.5,true]", ' {"a": 1} ', '{"a":1} ', "1e400", "{}"],
)
def test_json_from_postgres_reads_as_json_loads_reads_it(text: str) -> None:
    assert store.loads_json(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a":1} x', "nul"])
def test_json_from_postgres_that_is_not_json_is_refused(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        store.loads_json(text.encode())
