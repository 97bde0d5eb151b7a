"""Python values <-> ``google.protobuf.Value``, the JSON payloads of the protocol.

A value is JSON-serializable when :func:`json.dumps` accepts it (dataclass instances
are turned into dicts first); NaN and infinities are refused, since Postgres' jsonb
refuses them too. ``Value`` stores every number as a double, so integral numbers come
back as ``int`` (up to 2**53, where a double is still exact), as a JSON parser would
give them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from google.protobuf import struct_pb2

__all__ = ["dumps", "from_value", "json_value", "parsed_value", "to_value"]

_EXACT_INT = 2**53


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable")


def dumps(obj: Any) -> str:
    """Strict JSON text of ``obj``; TypeError or ValueError when it is not JSON."""
    if obj is None:  # what most handlers return
        return "null"
    return json.dumps(obj, allow_nan=False, default=_default, separators=(",", ":"))


def to_value(obj: Any) -> struct_pb2.Value:
    """The ``Value`` holding ``obj``; TypeError or ValueError when it is not JSON."""
    return json_value(dumps(obj))


def json_value(text: str) -> struct_pb2.Value:
    """The ``Value`` holding the JSON ``text`` (as :func:`dumps` writes it)."""
    return parsed_value(None if text == "null" else json.loads(text))


def parsed_value(obj: Any) -> struct_pb2.Value:
    """The ``Value`` holding ``obj``, a JSON value as :func:`json.loads` gives it
    (dicts, lists, strings, numbers, booleans, None); not checked further."""
    value = struct_pb2.Value()
    _fill(value, obj)
    return value


def _fill(value: struct_pb2.Value, obj: Any) -> None:
    # What json_format.Parse does, without its generic (and slower) message walk.
    if obj is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(obj, bool):
        value.bool_value = obj
    elif isinstance(obj, int | float):
        value.number_value = obj
    elif isinstance(obj, str):
        value.string_value = obj
    elif isinstance(obj, dict):
        value.struct_value.SetInParent()  # so that {} is set too
        value.struct_value.update(obj)
    else:
        value.list_value.SetInParent()
        value.list_value.extend(obj)


def from_value(value: struct_pb2.Value | None) -> Any:
    """The Python value held by ``value``; ``None`` for an unset or null value."""
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) <= _EXACT_INT else number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return {k: from_value(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    return None  # null, or unset
