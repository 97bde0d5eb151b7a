"""Claim answers written straight in protobuf's wire format, for the hot path.

A ``ClaimedStep`` built through the Python API costs a Python call per field and one
per JSON node of its payloads (upb sets each through Python); each timestamp and
UUID adds a conversion. Here a Claim's steps are written as bytes instead (each
field's tag, length and value), and the whole ``ClaimResponse`` is parsed once by
upb, in C, from them: the message is the same, field for field, as the one the
Python API would build (tests/test_wire.py holds the two side by side). Field
numbers come from the generated descriptors, never from this file.

The rare parts of a step (its upstream failures, its journal) are still built
through the Python API and serialized, then appended: serialized messages
concatenated are the message merged from them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.descriptor import FieldDescriptor

from cyclone.v1 import worker_service_pb2 as worker_pb
from service.db.records import ClaimedStep

_VARINT, _I64, _LEN = 0, 1, 2
_BYTE = [bytes((i,)) for i in range(128)]
_DOUBLE = struct.Struct("<d").pack


def varint(n: int) -> bytes:
    """An integer as protobuf's base-128 varint (a negative one as its 64-bit two's
    complement, as int32 and int64 fields are written)."""
    if 0 <= n < 128:
        return _BYTE[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 127:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(descriptor: Any, name: str, wire_type: int) -> bytes:
    """A field's tag: its number (from a message's descriptor) and wire type."""
    field: FieldDescriptor = descriptor.fields_by_name[name]
    return varint(field.number << 3 | wire_type)


def field_tag(message: Any, name: str) -> bytes:
    """The tag of a message class's length-delimited field (a string, bytes, an
    embedded message, an item of a repeated one)."""
    return _tag(message.DESCRIPTOR, name, _LEN)


def length_delimited(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field, serialized: its tag, the body's length, the body."""
    return tag + varint(len(body)) + body


# google.protobuf.Value and its containers.
_V = struct_pb2.Value.DESCRIPTOR
_NULL = _tag(_V, "null_value", _VARINT) + _BYTE[0]
_NUMBER = _tag(_V, "number_value", _I64)
_STRING = _tag(_V, "string_value", _LEN)
_TRUE = _tag(_V, "bool_value", _VARINT) + _BYTE[1]
_FALSE = _tag(_V, "bool_value", _VARINT) + _BYTE[0]
_STRUCT = _tag(_V, "struct_value", _LEN)
_LIST = _tag(_V, "list_value", _LEN)
_FIELDS = _tag(struct_pb2.Struct.DESCRIPTOR, "fields", _LEN)
_ENTRY_KEY = _tag(struct_pb2.Struct.DESCRIPTOR.fields_by_name["fields"].message_type, "key", _LEN)
_ENTRY_VALUE = _tag(
    struct_pb2.Struct.DESCRIPTOR.fields_by_name["fields"].message_type, "value", _LEN
)
_VALUES = _tag(struct_pb2.ListValue.DESCRIPTOR, "values", _LEN)


def value_bytes(obj: Any) -> bytes:
    """The serialized ``google.protobuf.Value`` of a JSON value as json.loads gives it
    (dicts, lists, strings, numbers, booleans, None): what ``parsed_value(obj)`` would
    serialize to, without building it."""
    kind = type(obj)
    if kind is str:
        text: bytes = obj.encode()
        return _STRING + varint(len(text)) + text
    if obj is None:
        return _NULL
    if kind is bool:
        return _TRUE if obj else _FALSE
    if kind is int or kind is float:
        return _NUMBER + _DOUBLE(obj)
    if kind is dict:
        entries = []
        for key, child in obj.items():
            name = key.encode()
            value = value_bytes(child)
            entry = _ENTRY_KEY + varint(len(name)) + name + _ENTRY_VALUE + varint(len(value))
            entries.append(_FIELDS + varint(len(entry) + len(value)) + entry + value)
        body = b"".join(entries)
        return _STRUCT + varint(len(body)) + body
    values = [value_bytes(child) for child in obj]
    body = b"".join([_VALUES + varint(len(value)) + value for value in values])
    return _LIST + varint(len(body)) + body


# google.protobuf.Timestamp
_TS = worker_pb.ClaimedStep.DESCRIPTOR.fields_by_name["deadline"].message_type
_SECONDS = _tag(_TS, "seconds", _VARINT)
_NANOS = _tag(_TS, "nanos", _VARINT)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp_bytes(dt: datetime) -> bytes:
    """The serialized Timestamp of an aware datetime (as convert.timestamp makes it)."""
    delta = dt - _EPOCH
    seconds = delta.days * 86400 + delta.seconds
    nanos = delta.microseconds * 1000
    return (_SECONDS + varint(seconds) if seconds else b"") + (
        _NANOS + varint(nanos) if nanos else b""
    )


def _timestamp(tag: bytes, dt: datetime | None) -> bytes:
    return b"" if dt is None else length_delimited(tag, timestamp_bytes(dt))


# cyclone.v1.ClaimedStep and ClaimResponse
_CS = worker_pb.ClaimedStep.DESCRIPTOR
_RUN_ID = _tag(_CS, "run_id", _LEN)
_NODE = _tag(_CS, "node", _LEN)
_ACTION = _tag(_CS, "action", _LEN)
_WORKFLOW = _tag(_CS, "workflow", _LEN)
_ATTEMPT = _tag(_CS, "attempt", _VARINT)
_MAX_ATTEMPTS = _tag(_CS, "max_attempts", _VARINT)
_LEASE_TOKEN = _tag(_CS, "lease_token", _LEN)
_LEASE_EXPIRES_AT = _tag(_CS, "lease_expires_at", _LEN)
_DEADLINE = _tag(_CS, "deadline", _LEN)
_EFFECT_UNCERTAIN = _tag(_CS, "effect_uncertain", _VARINT) + _BYTE[1]
_INPUT = _tag(_CS, "input", _LEN)
_RUN_INPUT = _tag(_CS, "run_input", _LEN)
_PROGRESS = _tag(_CS, "progress", _LEN)
_UPSTREAM = _tag(_CS, "upstream_outputs", _LEN)
_UPSTREAM_KEY = _tag(_CS.fields_by_name["upstream_outputs"].message_type, "key", _LEN)
_UPSTREAM_VALUE = _tag(_CS.fields_by_name["upstream_outputs"].message_type, "value", _LEN)
_STEPS = _tag(worker_pb.ClaimResponse.DESCRIPTOR, "steps", _LEN)
_RUN_ID_36 = _RUN_ID + varint(36)
_TOKEN_36 = _LEASE_TOKEN + varint(36)


class ClaimWriter:
    """Writes one Claim's steps. The parts its steps share (the lease's expiry and
    deadline, action, workflow, max attempts: one claim's steps mostly have the same;
    their run's input and their upstream outputs, which the leaves of one fan-out
    share) are written once per claim and reused; nothing outlives the claim."""

    def __init__(self, rare: Callable[[ClaimedStep], worker_pb.ClaimedStep | None]) -> None:
        # rare(row): the parts of a step written through the Python API, or None.
        self._rare = rare
        self._shared: dict[tuple[Any, ...], bytes] = {}
        self._strings: dict[str, bytes] = {}
        self._run_inputs: dict[str, bytes] = {}
        self._upstreams: dict[str, bytes] = {}

    def _head(self, r: ClaimedStep) -> bytes:
        key = (r.action, r.workflow, r.max_attempts, r.lease_expires_at, r.deadline_at)
        head = self._shared.get(key)
        if head is None:
            head = self._shared[key] = b"".join(
                (
                    length_delimited(_ACTION, r.action.encode()),
                    length_delimited(_WORKFLOW, r.workflow.encode()),
                    _MAX_ATTEMPTS + varint(r.max_attempts) if r.max_attempts else b"",
                    _timestamp(_LEASE_EXPIRES_AT, r.lease_expires_at),
                    _timestamp(_DEADLINE, r.deadline_at),
                )
            )
        return head

    def _node(self, node: str) -> bytes:
        encoded = self._strings.get(node)
        if encoded is None:
            encoded = self._strings[node] = length_delimited(_NODE, node.encode())
        return encoded

    def _run_input(self, text: str) -> bytes:
        """The run_input field of a run's input given as JSON text (none for JSON null,
        as for no input)."""
        encoded = self._run_inputs.get(text)
        if encoded is None:
            obj = json.loads(text)
            encoded = b"" if obj is None else length_delimited(_RUN_INPUT, value_bytes(obj))
            self._run_inputs[text] = encoded
        return encoded

    def _upstream(self, text: str) -> bytes:
        """The upstream_outputs entries of a JSON object of outputs by node, given as
        text: a fan-out's leaves have the same one, parsed and written once per claim
        rather than once per leaf (docs/performance.md, "Wide fan-outs")."""
        encoded = self._upstreams.get(text)
        if encoded is None:
            # Written inline: a join's upstream has an entry per upstream node (10,000
            # in the bench's fan), and three calls of length_delimited per entry cost
            # it 12 % more.
            entries: list[bytes] = []
            for node, output in json.loads(text).items():
                name = node.encode()
                value = value_bytes(output)
                entry = _UPSTREAM_KEY + varint(len(name)) + name + _UPSTREAM_VALUE
                entry += varint(len(value)) + value
                entries += (_UPSTREAM, varint(len(entry)), entry)
            encoded = self._upstreams[text] = b"".join(entries)
        return encoded

    def step(self, r: ClaimedStep) -> bytes:
        """The serialized ClaimedStep of a claimed row."""
        run_id = r.run_id.encode()
        token = r.lease_token.encode()
        # Ids are canonical UUID text, 36 bytes: their tag and length are one constant.
        parts = [
            _RUN_ID_36 + run_id if len(run_id) == 36 else length_delimited(_RUN_ID, run_id),
            self._node(r.node),
            self._head(r),
            _TOKEN_36 + token if len(token) == 36 else length_delimited(_LEASE_TOKEN, token),
        ]
        if r.attempt:
            parts += (_ATTEMPT, varint(r.attempt))
        if r.effect_uncertain:
            parts.append(_EFFECT_UNCERTAIN)
        # The fields in their numbers' order, as the Python API writes them.
        if r.input is not None:
            parts.append(length_delimited(_INPUT, value_bytes(r.input)))
        if r.run_input is not None:
            parts.append(self._run_input(r.run_input))
        if r.upstream is not None:
            parts.append(self._upstream(r.upstream))
        if r.progress is not None:
            parts.append(length_delimited(_PROGRESS, value_bytes(r.progress)))
        rare = self._rare(r)
        if rare is not None:
            parts.append(rare.SerializeToString())
        return b"".join(parts)

    def response(self, rows: Iterable[ClaimedStep]) -> worker_pb.ClaimResponse:
        """A ClaimResponse of these steps, parsed once from their bytes."""
        steps = [self.step(r) for r in rows]
        return worker_pb.ClaimResponse.FromString(
            b"".join([_STEPS + varint(len(step)) + step for step in steps])
        )


def claim_response(
    rows: Sequence[ClaimedStep], rare: Callable[[ClaimedStep], worker_pb.ClaimedStep | None]
) -> worker_pb.ClaimResponse:
    """The ClaimResponse handing out ``rows`` (``rare``: see ClaimWriter)."""
    return ClaimWriter(rare).response(rows)


_WORK_STEPS = _tag(worker_pb.WorkResponse.DESCRIPTOR, "steps", _LEN)


def work_steps(
    rows: Sequence[ClaimedStep], rare: Callable[[ClaimedStep], worker_pb.ClaimedStep | None]
) -> bytes:
    """The serialized WorkResponse handing out ``rows``, as gRPC sends it: the steps
    are written once, never parsed (``rare``: see ClaimWriter)."""
    writer = ClaimWriter(rare)
    return b"".join([_WORK_STEPS + varint(len(s)) + s for s in map(writer.step, rows)])
