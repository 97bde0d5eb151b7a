"""Registered handlers, and how one is called with a context.

A handler takes the context, and optionally the step's input as a second parameter:

    def charge(ctx): ...
    def charge(ctx, order: dict): ...
    def charge(ctx, order: Order): ...   # Order a dataclass
    async def charge(ctx, order: Order): ...

The input is the node's static input layered over the run input when both are JSON
objects (the node's keys win), otherwise the node input when it is set, else the run
input. A parameter annotated with a dataclass receives an instance built from the
input's keys that are fields of it (other keys are ignored, so one run input can
serve several handlers). An input that does not fit fails the step for good: another
attempt would get the same input.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cyclone import dag, flow
from pyclient.context import Context
from pyclient.errors import InvalidArgument, NonRetryableError
from pyclient.workflow import Seconds, seconds


class InputMismatch(NonRetryableError):
    """The step's input does not fit the handler's input type."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` claims of an action in any window of ``period`` seconds (or a
    timedelta), across every worker and server (docs/flow-control.md)."""

    count: int
    period: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", seconds(self.period))
        try:
            flow.check_rate_limit("rate limit", self.count, self.period)
        except dag.InvalidWorkflow as exc:
            raise InvalidArgument(str(exc)) from None

    @classmethod
    def of(cls, value: RateLimit | tuple[int, Seconds] | None) -> RateLimit | None:
        if value is None or isinstance(value, RateLimit):
            return value
        count, period = value
        return cls(count, seconds(period) or 0.0)


@dataclass(frozen=True, slots=True)
class Action:
    """A handler registered for an action name."""

    name: str
    fn: Callable[..., Any]
    timeout: float | None = None
    unsafe_to_repeat: bool = False
    #: A durable function: its step calls are journaled and replayed.
    durable: bool = False
    rate_limit: RateLimit | None = None
    is_async: bool = False
    takes_input: bool = False
    input_type: type | None = None

    @classmethod
    def of(
        cls,
        name: str,
        fn: Callable[..., Any],
        *,
        timeout: float | None = None,
        unsafe_to_repeat: bool = False,
        durable: bool = False,
        rate_limit: RateLimit | tuple[int, Seconds] | None = None,
    ) -> Action:
        """Inspect ``fn``; InvalidArgument for a bad name or signature."""
        try:
            dag.check_name("action", name)
        except dag.InvalidWorkflow as exc:
            raise InvalidArgument(str(exc)) from None
        if timeout is not None and timeout <= 0:
            raise InvalidArgument(f"action {name!r}: timeout must be positive, got {timeout}")
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not 1 <= len(params) <= 2:
            raise InvalidArgument(
                f"action {name!r}: the handler must take (ctx) or (ctx, input), "
                f"not {len(params)} positional parameters"
            )
        input_type = None
        if len(params) == 2:
            hint = _hints(fn).get(params[1].name)
            if isinstance(hint, type) and dataclasses.is_dataclass(hint):
                input_type = hint
        return cls(
            name=name,
            fn=fn,
            timeout=timeout,
            unsafe_to_repeat=unsafe_to_repeat,
            durable=durable,
            rate_limit=RateLimit.of(rate_limit),
            is_async=inspect.iscoroutinefunction(fn),
            takes_input=len(params) == 2,
            input_type=input_type,
        )

    def arguments(self, ctx: Context) -> tuple[Any, ...]:
        """The positional arguments to call the handler with for ``ctx``."""
        if not self.takes_input:
            return (ctx,)
        value = handler_input(ctx)
        if self.input_type is not None:
            value = build_dataclass(self.input_type, value)
        return (ctx, value)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an unresolvable annotation: treat the input as untyped
        return {}


def handler_input(ctx: Context) -> Any:
    """The node input layered over the run input (see the module docstring)."""
    if isinstance(ctx.input, dict) and isinstance(ctx.run_input, dict):
        return {**ctx.run_input, **ctx.input}
    return ctx.run_input if ctx.input is None else ctx.input


def build_dataclass(cls: type, value: Any) -> Any:
    """``cls`` built from the keys of ``value`` that are its fields."""
    if not isinstance(value, dict):
        raise InputMismatch(
            f"{cls.__name__} needs a JSON object as input, got {dag.excerpt(repr(value))}"
        )
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    try:
        return cls(**{k: v for k, v in value.items() if k in names})
    except TypeError as exc:
        raise InputMismatch(f"input does not fit {cls.__name__}: {exc}") from None
