"""How a step call's failure is recorded, and how the body sees it.

The journal keeps a failure as a StepCallError: ``type`` the exception's qualified name
(``CardDeclined``), ``message`` its text, ``details`` its traceback, and what is needed
to rebuild it: ``module`` the module of its class, ``args`` its args when they are JSON
(else its message alone), and ``attributes`` the entries of its ``__dict__`` whose
values are JSON, up to :data:`MAX_DATA` characters of JSON for args and attributes
together (the server refuses more). The body sees the failure as rebuilt from this
record on its first run as on every replay, so an ``except`` block takes the same path
both times.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from typing import Any

from cyclone.jsonvalue import dumps
from pyclient.durable._calls import Call
from pyclient.durable._errors import StepFailed, StepTimeout
from pyclient.models import StepCallError

#: Most JSON text kept for an exception's args and attributes together: under the
#: server's 16 KiB, with room for the keys around them.
MAX_DATA = 15 * 1024


def record_error(exc: BaseException, *, limit: int, type_limit: int) -> StepCallError:
    """The StepCallError that records ``exc`` (texts cut to ``limit`` characters)."""
    cls = type(exc)
    budget = [MAX_DATA]
    args = _kept(list(exc.args), budget)
    if args is None:
        args = [str(exc)] if _kept(str(exc), budget) is not None else []
    attributes: dict[str, Any] = {}
    for name, value in getattr(exc, "__dict__", {}).items():
        if isinstance(name, str) and not name.startswith("__"):
            kept = _kept(value, budget)
            if kept is not None:
                attributes[name] = kept
    module = cls.__module__ if len(cls.__module__) <= type_limit else ""
    return StepCallError(
        type=clip(cls.__qualname__, type_limit),
        message=clip(str(exc), limit),
        details=clip("".join(traceback.format_exception(exc)), limit),
        module=module,
        args=args,
        attributes=attributes,
    )


def _kept(value: Any, budget: list[int]) -> Any:
    """``value`` as JSON would give it back, if it is JSON and fits in what is left of
    ``budget`` (which it then uses); None otherwise."""
    try:
        text = dumps(value)
    except (TypeError, ValueError, RecursionError):
        return None
    if len(text) > budget[0]:
        return None
    budget[0] -= len(text) + 1
    return json.loads(text)


class Recorded:
    """A recorded failure, read back: the exception's importable type, its args and
    attributes, and the exception rebuilt from them (None when its class is not loaded
    here or cannot be rebuilt)."""

    def __init__(self, error: StepCallError, home: str | None = None):
        self.type_name = error.type
        self.message = error.message
        self.details = error.details
        module = error.module
        self.args: list[Any] = error.args if isinstance(error.args, list) else []
        attributes = error.attributes
        self.attributes: dict[str, Any] = attributes if isinstance(attributes, dict) else {}
        #: ``module.qualname`` of the exception's class ("CardDeclined" alone when the
        #: journal does not say: an older SDK's record, another language's, an operator's).
        self.type = f"{module}.{error.type}" if module else error.type
        self.exception = _rebuild(_find_class(module, error.type, home), self.args, self.attributes)


def _find_class(module: str, qualname: str, home: str | None) -> type | None:
    """The exception class named ``module.qualname``, among the modules loaded; a
    class of the script (``__main__``) is looked for in ``home`` too, the module of the
    step function (the same file, imported)."""
    if not module:
        return None
    for name in (module, home if module == "__main__" else None):
        found: Any = sys.modules.get(name) if name else None
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    return None


def _rebuild(cls: type | None, args: list[Any], attributes: dict[str, Any]) -> Exception | None:
    """An instance of ``cls`` with these args and attributes, made without calling its
    ``__init__`` (whose parameters may be anything); None when it cannot be made. An
    attribute the class refuses (a read-only property) is left out."""
    if cls is None:
        return None
    try:
        exc = cls.__new__(cls, *args)
        exc.args = tuple(args)
    except Exception:
        return None
    if not isinstance(exc, Exception):
        return None
    for name, value in attributes.items():
        with contextlib.suppress(Exception):
            setattr(exc, name, value)
    return exc


def clip(text: str, limit: int) -> str:
    text = text.replace("\x00", "\\0")
    return text if len(text) <= limit else text[: limit - 20] + " ...(cut)"


def step_failed(
    step_id: str, error: StepCallError, call: Call | None, *, non_retryable: bool
) -> StepFailed:
    """The StepFailed a body sees for the recorded failure ``error`` of a call."""
    recorded = Recorded(error, call.module if call is not None else None)
    cls = StepTimeout if recorded.type_name == "StepTimeout" else StepFailed
    return cls(
        step_id,
        recorded.type_name,
        recorded.message,
        recorded.details,
        non_retryable=non_retryable,
        type=recorded.type,
        attributes=recorded.attributes,
        error_args=recorded.args,
        exception=recorded.exception,
    )
