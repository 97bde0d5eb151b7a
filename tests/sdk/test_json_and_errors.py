"""JSON payloads <-> protobuf Value, and gRPC errors -> SDK exceptions."""

from __future__ import annotations

import dataclasses
import json
import math

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from cyclone.jsonvalue import from_value, to_value
from pyclient import errors


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -3, 2.5, "text", [], {}, {"a": [1, {"b": None}], "c": "d"}, 2**53],
)
def test_json_values_survive_the_round_trip_with_integers_kept(value):
    back = from_value(to_value(value))
    assert back == value
    assert type(back) is type(value)


NESTED = {"a": {}, "b": [], "c": [[], {}], "d": [{"e": [1, 1.5]}], "f": None, "g": [True, ""]}


@pytest.mark.parametrize("value", [None, False, -0.0, 1e300, 2**60, "", [], {}, [[[]]], NESTED])
def test_values_are_converted_as_protobuf_json_format_converts_them(value):
    text = json.dumps(value)
    reference = json_format.Parse(text, struct_pb2.Value())
    assert to_value(value) == reference
    assert from_value(reference) == json_format.MessageToDict(reference) == json.loads(text)


def test_integers_beyond_double_precision_stay_floats():
    assert isinstance(from_value(to_value(2**60)), float)


def test_dataclasses_and_tuples_become_json():
    @dataclasses.dataclass
    class Receipt:
        email: str
        lines: tuple[int, ...]

    assert from_value(to_value(Receipt("a@b", (1, 2)))) == {"email": "a@b", "lines": [1, 2]}


@pytest.mark.parametrize("value", [math.nan, math.inf, object(), {1, 2}])
def test_values_that_are_not_json_are_refused(value):
    with pytest.raises((TypeError, ValueError)):
        to_value(value)


def test_an_unset_value_reads_as_none():
    assert from_value(None) is None


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.NOT_FOUND, errors.NotFound),
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
        (grpc.StatusCode.ABORTED, errors.LeaseLost),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
        (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
    ],
)
def test_rpc_errors_become_sdk_exceptions_with_the_servers_message(code, cls):
    exc = errors.from_rpc_error(_RpcError(code, "run 42 is not blocked"))
    assert type(exc) is cls
    assert isinstance(exc, errors.CycloneError)
    assert exc.message == str(exc) == "run 42 is not blocked"
    assert exc.code is code


def test_unmapped_codes_keep_their_name_in_the_message():
    exc = errors.from_rpc_error(_RpcError(grpc.StatusCode.INTERNAL, "boom"))
    assert type(exc) is errors.CycloneError
    assert exc.message == "INTERNAL: boom"
    assert exc.code is grpc.StatusCode.INTERNAL


def test_an_error_without_a_message_uses_its_docstring():
    assert str(errors.NotFound()) == "No such run or node."
    assert str(errors.from_rpc_error(_RpcError(grpc.StatusCode.UNAVAILABLE, ""))) == (
        "The Cyclone server is unavailable."
    )


def test_retry_after_refuses_a_negative_delay():
    with pytest.raises(ValueError, match="seconds >= 0"):
        errors.RetryAfter(-1)
