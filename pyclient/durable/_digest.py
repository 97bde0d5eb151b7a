"""The digest of a step call's arguments, recorded with the call so that a replay can
tell that a recorded call is now made with other arguments.

The digest is the SHA-256, as 64 lowercase hexadecimal characters, of the UTF-8 bytes
of the canonical JSON text of ``[args, kwargs]``: the positional arguments as a list
and the keyword arguments as an object, keys sorted, no whitespace, strings as they are
(no ``\\u`` escapes but the ones JSON requires), numbers as Python's ``json`` writes
them. A dataclass instance is written as the object of its fields, a tuple as a list;
anything else that is not JSON is refused (:class:`ArgumentsNotJson`) rather than left
out, since a digest that skips an argument would miss its change.
docs/other-languages.md gives the rule for other SDKs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable
from typing import Any

from pyclient.errors import NonRetryableError


class ArgumentsNotJson(NonRetryableError, TypeError):
    """A step call's arguments cannot be digested: one of them is not JSON. Raised into
    the body at the call, which is not made (the node fails for good unless the body
    handles it)."""


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (TypeError or ValueError when it is not
    JSON)."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_default,
    )


def digest_of(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value``, lowercase hex."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def args_digest(
    step: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    custom: Callable[..., Any] | None = None,
) -> str:
    """The digest of a call of step ``step`` (function ``fn``) with ``args`` and
    ``kwargs``; with ``custom``, the digest of what ``custom(*args, **kwargs)``
    returns. ArgumentsNotJson names the argument that is not JSON."""
    if custom is not None:
        value = custom(*args, **kwargs)
        try:
            return digest_of(value)
        except (TypeError, ValueError) as exc:
            raise ArgumentsNotJson(
                f"step {step!r}: its digest= function returned a value that is not JSON "
                f"({exc}); return the JSON values that stand for the arguments"
            ) from None
    try:
        return digest_of([list(args), kwargs])
    except (TypeError, ValueError) as exc:
        raise ArgumentsNotJson(
            f"step {step!r}: argument {_culprit(fn, args, kwargs)} is not JSON ({exc}), so "
            "its call cannot be checked on replay. Pass JSON values (or a dataclass), name "
            "what stands for the arguments with @step(digest=lambda ...: ...), or turn the "
            "check off with @step(check_args=False)"
        ) from None


def _culprit(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """How to name the first argument that is not JSON: its parameter's name when the
    signature tells it, else its position."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    for i, value in enumerate(args):
        if not _is_json(value):
            name = names[i] if i < len(names) else f"#{i + 1}"
            return f"{name!r} ({type(value).__name__})"
    for key, value in kwargs.items():
        if not _is_json(value):
            return f"{key!r} ({type(value).__name__})"
    return "(a key that is not a string)"


def _is_json(value: Any) -> bool:
    try:
        canonical_json(value)
    except (TypeError, ValueError):
        return False
    return True
