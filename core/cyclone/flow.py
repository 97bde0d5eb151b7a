"""Flow control, shared by the server and the SDK: the ranges of priorities, concurrency
limits and rate limits, and the concurrency key template (docs/flow-control.md).

A key template is text with fields in braces: ``{run.a.b}`` is the field ``a.b`` of the
run input, ``{node.a}`` the field ``a`` of the node's own input; ``{{`` and ``}}`` stand
for literal braces. A field must hold a string (used as is), a number or a boolean
(written as JSON); anything else, or a missing field, is an error of the call that
creates the run (Submit, SubmitOnce, StartChild, CreateSchedule for its firings).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.errors import InvalidFlow

__all__ = [
    "MAX_CONCURRENCY_LIMIT",
    "MAX_KEY_LENGTH",
    "MAX_PRIORITY",
    "MAX_RATE_COUNT",
    "MAX_RATE_PERIOD_S",
    "MAX_START_AHEAD_S",
    "MIN_PRIORITY",
    "MIN_RATE_PERIOD_S",
    "InvalidFlow",
    "KeyTemplate",
    "check_priority",
    "check_rate_limit",
]

MIN_PRIORITY = -1_000_000
MAX_PRIORITY = 1_000_000
MAX_CONCURRENCY_LIMIT = 10_000
#: Of the template and of the key it gives.
MAX_KEY_LENGTH = 256
MAX_RATE_COUNT = 1_000_000
MIN_RATE_PERIOD_S = 0.001
MAX_RATE_PERIOD_S = 24 * 3600.0
#: How far ahead a run may be submitted to start.
MAX_START_AHEAD_S = 366 * 24 * 3600.0

_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_PATH = re.compile(r"(run|node)((?:\.[A-Za-z0-9_-]+)+)")


def check_priority(where: str, priority: int) -> None:
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidFlow(
            f"{where}: priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {priority}"
        )


def check_rate_limit(where: str, count: int, period_s: float) -> None:
    if not 1 <= count <= MAX_RATE_COUNT:
        raise InvalidFlow(
            f"{where}: rate limit count must be between 1 and {MAX_RATE_COUNT}, got {count}"
        )
    if not MIN_RATE_PERIOD_S <= period_s <= MAX_RATE_PERIOD_S:
        raise InvalidFlow(
            f"{where}: rate limit period must be between {MIN_RATE_PERIOD_S:g}s and "
            f"{MAX_RATE_PERIOD_S:g}s, got {period_s:g}s"
        )


@dataclass(frozen=True)
class KeyTemplate:
    """A parsed concurrency key template: literal text and (source, path) fields."""

    parts: tuple[str | tuple[str, tuple[str, ...]], ...]

    @classmethod
    def parse(cls, where: str, template: str) -> KeyTemplate:
        if not template:
            raise InvalidFlow(f"{where}: concurrency key is empty")
        if len(template) > MAX_KEY_LENGTH:
            raise InvalidFlow(
                f"{where}: concurrency key template is {len(template)} characters; "
                f"the limit is {MAX_KEY_LENGTH}"
            )
        parts: list[str | tuple[str, tuple[str, ...]]] = []
        pos = 0
        for m in _FIELD.finditer(template):
            if m.start() > pos:
                parts.append(template[pos : m.start()])
            pos = m.end()
            token = m.group(0)
            if token in ("{{", "}}"):
                parts.append(token[0])
                continue
            field = m.group(1)
            path = _PATH.fullmatch(field) if field is not None else None
            if path is None:
                raise InvalidFlow(
                    f"{where}: concurrency key {template!r}: {token!r} at {m.start()} is not "
                    "a field: write {run.name} or {node.name} (a dotted path), and {{ or }} "
                    "for a brace"
                )
            parts.append((path.group(1), tuple(path.group(2)[1:].split("."))))
        if pos < len(template):
            parts.append(template[pos:])
        return cls(tuple(parts))

    def render(self, where: str, run_input: Any, node_input: Any) -> str:
        """The key for this run input and node input."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            source, path = part
            out.append(_field(where, source, path, run_input if source == "run" else node_input))
        key = "".join(out)
        if not key or len(key) > MAX_KEY_LENGTH:
            raise InvalidFlow(
                f"{where}: concurrency key is {len(key)} characters; it must be 1 to "
                f"{MAX_KEY_LENGTH}"
            )
        return key


def _field(where: str, source: str, path: Sequence[str], value: Any) -> str:
    for name in path:
        if not isinstance(value, dict) or name not in value:
            raise InvalidFlow(
                f"{where}: concurrency key field {{{source}.{'.'.join(path)}}} is missing "
                f"from the {source} input"
            )
        value = value[name]
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))  # JSON numbers arrive as floats: 42, not 42.0
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    raise InvalidFlow(
        f"{where}: concurrency key field {{{source}.{'.'.join(path)}}} must be a string, "
        f"a number or a boolean, got {type(value).__name__}"
    )
