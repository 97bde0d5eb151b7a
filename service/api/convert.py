"""Protobuf <-> domain conversions for the servicers: JSON payloads, times, enums.

Stored JSON becomes a ``Value`` through cyclone.jsonvalue, as in the SDK; a client's
payload is checked here against the limits of the server that received it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from cyclone.jsonvalue import parsed_value
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


@dataclass(frozen=True, slots=True)
class Payloads:
    """JSON payloads from clients (run input, output, progress, a resolved result),
    checked against one server's size and nesting limits (--max-payload-bytes,
    --max-json-depth). Each server has its own."""

    max_bytes: int = 1 << 20
    max_depth: int = 32

    def to_python(self, value: struct_pb2.Value, what: str) -> Any:
        """A protobuf Value as a Python JSON value, checked against the limits."""
        self._check_size(value, what)
        return _checked_python(value, what, self.max_depth, 1)

    def _check_size(self, value: struct_pb2.Value, what: str) -> None:
        if (size := value.ByteSize()) > self.max_bytes:
            raise errors.ResourceExhausted(f"{what} is {size} bytes; the limit is {self.max_bytes}")

    def to_json(self, value: struct_pb2.Value, what: str) -> str:
        """A protobuf Value as JSON text for a jsonb parameter."""
        kind = value.WhichOneof("kind")
        if kind is None or kind == "null_value":
            # What most handlers return; unset reads as null, as in _checked_python.
            self._check_size(value, what)
            return "null"
        obj = self.to_python(value, what)
        # _checked_python has refused real NUL characters; the six characters ``\u0000``
        # in a string are plain text, escaped here as any backslash is.
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def optional_json(self, message: Message, field: str, what: str) -> str | None:
        """JSON text of an optional Value field, or None when the field is unset."""
        if not message.HasField(field):
            return None
        value: struct_pb2.Value = getattr(message, field)
        return self.to_json(value, what)


_NUL = "{} contains a NUL character, which Postgres refuses"


def _checked_python(value: struct_pb2.Value, what: str, max_depth: int, depth: int) -> Any:
    """``value`` as a Python JSON value (numbers as floats, as JSON's are), in one walk
    that refuses nesting past the limit, NaN and infinities (not JSON), and NUL
    characters, which Postgres's jsonb refuses (in a string or a key)."""
    if depth > max_depth:
        raise errors.InvalidArgument(f"{what} is nested more than {max_depth} levels deep")
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        text = value.string_value
        if "\x00" in text:
            raise errors.InvalidArgument(_NUL.format(what))
        return text
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            raise errors.InvalidArgument(f"{what} holds {number}, which JSON has no value for")
        return number
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        fields = value.struct_value.fields
        if any("\x00" in key for key in fields):
            raise errors.InvalidArgument(_NUL.format(what))
        return {
            key: _checked_python(child, what, max_depth, depth + 1) for key, child in fields.items()
        }
    if kind == "list_value":
        return [
            _checked_python(child, what, max_depth, depth + 1) for child in value.list_value.values
        ]
    # null_value, or no kind set: JSON null, as MessageToDict reads it.
    return None


#: The range of google.protobuf.Timestamp: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_MIN_TS_SECONDS = -62_135_596_800
_MAX_TS_SECONDS = 253_402_300_799


def to_datetime(ts: timestamp_pb2.Timestamp, what: str) -> datetime:
    """A Timestamp from a client as an aware datetime; INVALID_ARGUMENT when it lies
    outside the range the Timestamp type defines (which Python cannot represent)."""
    if not _MIN_TS_SECONDS <= ts.seconds <= _MAX_TS_SECONDS or not 0 <= ts.nanos < 10**9:
        raise errors.InvalidArgument(
            f"{what} must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z "
            f"(seconds {ts.seconds}, nanos {ts.nanos})"
        )
    return ts.ToDatetime(tzinfo=UTC)


def timestamp(dt: datetime | str | None) -> timestamp_pb2.Timestamp | None:
    if dt is None:
        return None
    if isinstance(dt, str):
        dt = datetime.fromisoformat(dt)
    if dt.tzinfo is None:
        ts = timestamp_pb2.Timestamp()
        ts.FromDatetime(dt)
        return ts
    # The arithmetic of Timestamp.FromDatetime, without its checks and calendar calls:
    # every claimed step carries two of these.
    delta = dt - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=delta.days * 86400 + delta.seconds, nanos=delta.microseconds * 1000
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def set_json(message: Message, field: str, obj: Any) -> None:
    """Set a Value field from a stored JSON value; SQL NULL leaves it unset."""
    if obj is not None:
        getattr(message, field).CopyFrom(parsed_value(obj))


STEP_CALL_STATUS = {
    "started": types_pb2.STEP_CALL_STATUS_STARTED,
    "succeeded": types_pb2.STEP_CALL_STATUS_SUCCEEDED,
    "failed": types_pb2.STEP_CALL_STATUS_FAILED,
    "waiting": types_pb2.STEP_CALL_STATUS_WAITING,
}


def step_call(entry: Mapping[str, Any]) -> types_pb2.StepCall:
    """One journal entry (cyclone._step_call_json) as a StepCall."""
    call = types_pb2.StepCall(
        step_id=entry["step_id"],
        seq=entry["seq"],
        function=entry["function"],
        status=STEP_CALL_STATUS[entry["status"]],
        unsafe_to_repeat=entry["unsafe"],
        attempt=entry["attempt"],
        started_at=timestamp(entry["started_at"]),
        finished_at=timestamp(entry["finished_at"]),
        wake_at=timestamp(entry.get("wake_at")),
        waiting_for=entry.get("waiting_for") or "",
        args_digest=entry.get("args_digest") or "",
    )
    if entry["status"] == "succeeded":
        # JSON null included: a function that returned nothing still has an output.
        call.output.CopyFrom(parsed_value(entry["output"]))
    if (e := entry["error"]) is not None:
        call.error.CopyFrom(
            types_pb2.StepCallError(
                type=e["type"],
                message=e["message"],
                details=e["details"],
                module=e.get("module", ""),
            )
        )
        if "args" in e:
            call.error.args.CopyFrom(parsed_value(e["args"]))
        if "attributes" in e:
            call.error.attributes.CopyFrom(parsed_value(e["attributes"]))
    return call
