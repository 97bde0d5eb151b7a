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

from google.protobuf import json_format, struct_pb2

_EXACT_INT = 2**53


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable")


def dumps(obj: Any) -> str:
    """Strict JSON text of ``obj``; TypeError or ValueError when it is not JSON."""
    return json.dumps(obj, allow_nan=False, default=_default, separators=(",", ":"))


def to_value(obj: Any) -> struct_pb2.Value:
    """The ``Value`` holding ``obj``; TypeError or ValueError when it is not JSON."""
    return json_format.Parse(dumps(obj), struct_pb2.Value())


def from_value(value: struct_pb2.Value | None) -> Any:
    """The Python value held by ``value``; ``None`` for an unset or null value."""
    if value is None or value.WhichOneof("kind") is None:
        return None
    return _restore_ints(json_format.MessageToDict(value))


def _restore_ints(obj: Any) -> Any:
    if isinstance(obj, float):
        return int(obj) if obj.is_integer() and abs(obj) <= _EXACT_INT else obj
    if isinstance(obj, dict):
        return {k: _restore_ints(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_restore_ints(v) for v in obj]
    return obj
