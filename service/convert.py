"""Protobuf <-> domain conversions for the servicers: JSON payloads, times, enums."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from cyclone.v1 import types_pb2
from service import errors

RUN_STATUS = {
    "running": types_pb2.RUN_STATUS_RUNNING,
    "completed": types_pb2.RUN_STATUS_COMPLETED,
    "failed": types_pb2.RUN_STATUS_FAILED,
    "blocked": types_pb2.RUN_STATUS_BLOCKED,
    "cancelled": types_pb2.RUN_STATUS_CANCELLED,
}
RUN_STATUS_NAME = {v: k for k, v in RUN_STATUS.items()}

STEP_STATUS = {
    "pending": types_pb2.STEP_STATUS_PENDING,
    "available": types_pb2.STEP_STATUS_AVAILABLE,
    "running": types_pb2.STEP_STATUS_RUNNING,
    "completed": types_pb2.STEP_STATUS_COMPLETED,
    "discarded": types_pb2.STEP_STATUS_DISCARDED,
    "uncertain": types_pb2.STEP_STATUS_UNCERTAIN,
    "skipped": types_pb2.STEP_STATUS_SKIPPED,
    "cancelled": types_pb2.STEP_STATUS_CANCELLED,
}

TRIGGER_RULE = {
    types_pb2.TRIGGER_RULE_UNSPECIFIED: "all_success",
    types_pb2.TRIGGER_RULE_ALL_SUCCESS: "all_success",
    types_pb2.TRIGGER_RULE_ALL_DONE: "all_done",
    types_pb2.TRIGGER_RULE_ONE_FAILED: "one_failed",
}
TRIGGER_RULE_ENUM = {
    "all_success": types_pb2.TRIGGER_RULE_ALL_SUCCESS,
    "all_done": types_pb2.TRIGGER_RULE_ALL_DONE,
    "one_failed": types_pb2.TRIGGER_RULE_ONE_FAILED,
}


class PayloadLimits:
    """Size and nesting limits of JSON payloads (set from the server settings)."""

    max_bytes: int = 1 << 20
    max_depth: int = 32


def value_to_python(value: struct_pb2.Value, what: str) -> Any:
    """A protobuf Value as a Python JSON value, checked against the payload limits."""
    if value.ByteSize() > PayloadLimits.max_bytes:
        raise errors.ResourceExhausted(
            f"{what} is {value.ByteSize()} bytes; the limit is {PayloadLimits.max_bytes}"
        )
    _check_shape(value, what)
    return json_format.MessageToDict(value)


def value_to_json(value: struct_pb2.Value, what: str) -> str:
    """A protobuf Value as JSON text for a jsonb parameter."""
    obj = value_to_python(value, what)
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if "\\u0000" in text:
        raise errors.InvalidArgument(_NUL.format(what))
    return text


def optional_json(message: Any, field: str, what: str) -> str | None:
    """JSON text of an optional Value field, or None when the field is unset."""
    if not message.HasField(field):
        return None
    return value_to_json(getattr(message, field), what)


def python_to_value(obj: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if obj is None:
        value.null_value = struct_pb2.NULL_VALUE
        return value
    return json_format.ParseDict(obj, value)


_NUL = "{} contains a NUL character, which Postgres refuses"


def _check_shape(value: struct_pb2.Value, what: str) -> None:
    """Refuse nesting past the limit, NaN and infinities (not JSON), and NUL
    characters, which Postgres's jsonb refuses (in a string or a key)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > PayloadLimits.max_depth:
            raise errors.InvalidArgument(
                f"{what} is nested more than {PayloadLimits.max_depth} levels deep"
            )
        kind = v.WhichOneof("kind")
        if kind == "string_value" and "\x00" in v.string_value:
            raise errors.InvalidArgument(_NUL.format(what))
        if kind == "number_value" and not math.isfinite(v.number_value):
            raise errors.InvalidArgument(
                f"{what} holds {v.number_value}, which JSON has no value for"
            )
        if kind == "struct_value":
            fields = v.struct_value.fields
            if any("\x00" in key for key in fields):
                raise errors.InvalidArgument(_NUL.format(what))
            stack.extend((child, depth + 1) for child in fields.values())
        elif kind == "list_value":
            stack.extend((child, depth + 1) for child in v.list_value.values)


def timestamp(dt: datetime | str | None) -> timestamp_pb2.Timestamp | None:
    if dt is None:
        return None
    if isinstance(dt, str):
        dt = datetime.fromisoformat(dt)
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(dt)
    return ts


def set_json(message: Any, field: str, obj: Any) -> None:
    """Set a Value field from a stored JSON value; SQL NULL leaves it unset."""
    if obj is not None:
        getattr(message, field).CopyFrom(python_to_value(obj))
