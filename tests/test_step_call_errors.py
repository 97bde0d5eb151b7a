"""A step call's error keeps what a worker needs to rebuild the exception (its type's
module, its args and attributes) through EndStepCall, BeginStepCall, GetRun and the
claim's journal; bounded, and checked for shape."""

from __future__ import annotations

from typing import Any

import grpc

from cyclone.jsonvalue import parsed_value
from cyclone.v1 import admin_service_pb2, types_pb2
from pyclient._runs import value_field
from tests.helpers import claim, fail, get_run, rpc_error
from tests.test_step_calls import RECORDED, begin, end_request, journal, one_node


def _with_data(request: Any, *, module: str = "", args: Any = None, attributes: Any = None) -> Any:
    request.error.module = module
    if args is not None:
        request.error.args.CopyFrom(parsed_value(args))
    if attributes is not None:
        request.error.attributes.CopyFrom(parsed_value(attributes))
    return request


def _data(error: types_pb2.StepCallError) -> tuple[str, Any, Any]:
    return error.module, value_field(error, "args"), value_field(error, "attributes")


def test_an_errors_module_args_and_attributes_come_back_in_every_journal(cyclone_server):
    run_id, step = one_node(cyclone_server, max_attempts=1)
    data = {"module": "shop.errors", "args": ["declined", 7], "attributes": {"code": "x"}}
    request = _with_data(end_request(step, "pay", 1, error=("Declined", "no")), **data)
    ended = cyclone_server.workers.EndStepCall(request)
    expected = ("shop.errors", ["declined", 7], {"code": "x"})
    assert _data(ended.call.error) == expected
    assert _data(begin(cyclone_server, step, "pay", 1).call.error) == expected
    # A handled failure (a call after it) is kept when the attempt fails.
    cyclone_server.workers.EndStepCall(end_request(step, "after", 2, "ok"))
    fail(cyclone_server, step, "later", non_retryable=True)
    assert _data(get_run(cyclone_server, run_id).steps[0].journal[0].error) == expected
    cyclone_server.admin.Retry(
        admin_service_pb2.RetryRequest(run_id=run_id, node="body", reason="again")
    )
    [again] = claim(cyclone_server)
    assert begin(cyclone_server, again, "pay", 1).decision == RECORDED
    assert _data(again.journal[0].error) == expected


def test_an_error_without_them_keeps_its_shape(cyclone_server):
    run_id, step = one_node(cyclone_server)
    ended = cyclone_server.workers.EndStepCall(end_request(step, "pay", 1, error=("T", "m")))
    assert _data(ended.call.error) == ("", None, None)
    [row] = journal(cyclone_server, run_id)
    assert sorted(row[5]) == ["details", "message", "type"]


def test_args_and_attributes_past_16_kib_or_of_the_wrong_shape_are_refused(cyclone_server):
    run_id, step = one_node(cyclone_server)
    cases = [
        ({"args": ["a" * 9000], "attributes": {"b": "b" * 9000}}, "the limit is 16384"),
        ({"args": {"not": "a list"}}, "error.args must be a list"),
        ({"attributes": ["not", "an", "object"]}, "error.attributes must be an object"),
        ({"module": "m" * 201}, "error.module"),
    ]
    for data, says in cases:
        request = _with_data(end_request(step, "pay", 1, error=("T", "m")), **data)
        err = rpc_error(cyclone_server.workers.EndStepCall, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (data, err.details())
        assert says in err.details()
    assert journal(cyclone_server, run_id) == []
    # Just under the limit is kept whole.
    attributes = {"b": "b" * (16 * 1024 - 40)}
    request = _with_data(end_request(step, "pay", 1, error=("T", "m")), attributes=attributes)
    ended = cyclone_server.workers.EndStepCall(request)
    assert _data(ended.call.error)[2] == attributes
