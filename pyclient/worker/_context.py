"""The Context of a claimed step as the worker makes it: :class:`ClaimedContext`, whose
fields are read from the claimed step when the handler first asks for them.

The worker makes one Context per step, and most handlers read two or three of its
fields (or none): reading all of them from the protobuf message, converting inputs
and timestamps, and setting nineteen slots cost more than the rest of starting a step.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from cyclone.jsonvalue import from_value
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.context import Context, StepControl, context_fields, in_step_call, set_fields
from pyclient.models import UpstreamFailure, timestamp_datetime

#: The upstream outputs of a step that has none (most).
NO_UPSTREAM: MappingProxyType[str, Any] = MappingProxyType({})

#: Context's fields that are compared (``==``), in its order.
_compared = attrgetter(*(f.name for f in context_fields() if f.compare))


class ClaimedContext(Context):
    """A :class:`Context` read from its claimed step (``_step``) on first use.

    It is a Context in every way a handler can tell: frozen, each field the value
    ``Context(...)`` would hold (the same object each time it is read), equal to the
    Context of the same fields, and ``dataclasses.replace`` or ``copy`` give a plain
    Context. A field's value, once made, is kept in the Context's own slot.
    """

    __slots__ = ("_fixed", "_step")

    _step: pb.ClaimedStep
    #: A plain Context of the same fields, made when a step call first needs one.
    _fixed: Context | None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # What dataclasses.replace() and copy call: a new value is a plain Context
        # (claimed() makes instances of this class without calling it).
        return Context(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Context):
            return bool(_compared(self) == _compared(other))
        return NotImplemented

    __hash__ = Context.__hash__  # (defining __eq__ would unset it)

    def __repr__(self) -> str:
        return repr(self._plain())

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self._plain().__reduce_ex__(protocol)

    def _plain(self) -> Context:
        fixed = self._fixed
        if fixed is None:
            fixed = _put_fixed(self, in_step_call(self, None, None))  # every field read
        return fixed

    def _in_call(self, step_id: str, scope: Any) -> Context:
        # A durable body's step calls copy the context each: from the plain one, whose
        # fields are slots, not from the claimed step's properties.
        return in_step_call(self._plain(), step_id, scope)


def _put_fixed(ctx: ClaimedContext, fixed: Context) -> Context:
    _set_fixed(ctx, fixed)
    return fixed


_set_step = ClaimedContext.__dict__["_step"].__set__
_get_step = ClaimedContext.__dict__["_step"].__get__
_set_fixed = ClaimedContext.__dict__["_fixed"].__set__


def _read(name: str) -> property:
    """A field that is the claimed step's field of that name (a string or a number)."""
    get = attrgetter(name)

    def read(ctx: ClaimedContext) -> Any:
        return get(_get_step(ctx))

    return property(read)


def _made(name: str, make: Callable[[pb.ClaimedStep], Any]) -> property:
    """A field made from the claimed step by ``make`` when first read, then kept in the
    Context's slot of that name."""
    slot = Context.__dict__[name]  # the member descriptor of Context's own slot
    get, put = slot.__get__, slot.__set__

    def value(ctx: ClaimedContext) -> Any:
        try:
            return get(ctx)
        except AttributeError:  # not made yet
            made = make(_get_step(ctx))
            put(ctx, made)
            return made

    return property(value)


def _json(name: str) -> Callable[[pb.ClaimedStep], Any]:
    def make(step: pb.ClaimedStep) -> Any:
        return from_value(getattr(step, name)) if step.HasField(name) else None

    return make


def _time(name: str) -> Callable[[pb.ClaimedStep], Any]:
    def make(step: pb.ClaimedStep) -> Any:
        return timestamp_datetime(getattr(step, name)) if step.HasField(name) else None

    return make


def _upstream(step: pb.ClaimedStep) -> MappingProxyType[str, Any]:
    outputs = step.upstream_outputs
    if not outputs:
        return NO_UPSTREAM
    return MappingProxyType({k: from_value(v) for k, v in outputs.items()})


def _upstream_failures(step: pb.ClaimedStep) -> tuple[UpstreamFailure, ...]:
    failures = step.upstream_failures
    return tuple(map(UpstreamFailure.from_proto, failures)) if failures else ()


#: The fields read from the claimed step. The others (worker_id, step_id and the
#: private ones) are set by claimed().
_FROM_STEP: dict[str, property] = {
    **{
        name: _read(name)
        for name in (
            "run_id",
            "node",
            "action",
            "workflow",
            "attempt",
            "max_attempts",
            "effect_uncertain",
        )
    },
    "input": _made("input", _json("input")),
    "run_input": _made("run_input", _json("run_input")),
    "progress": _made("progress", _json("progress")),
    "upstream": _made("upstream", _upstream),
    "upstream_failures": _made("upstream_failures", _upstream_failures),
    "deadline": _made("deadline", _time("deadline")),
    "run_deadline": _made("run_deadline", _time("run_deadline")),
}
for _name, _prop in _FROM_STEP.items():
    setattr(ClaimedContext, _name, _prop)
_SET_HERE = {f.name for f in context_fields()} - set(_FROM_STEP)
assert {"worker_id", "step_id", "_control", "_durable", "_scope"} == _SET_HERE, _SET_HERE

_new_object = object.__new__


def claimed(
    step: pb.ClaimedStep, worker_id: str, control: StepControl, durable: object | None
) -> ClaimedContext:
    """The Context of ``step``, claimed by the worker ``worker_id``."""
    ctx: ClaimedContext = _new_object(ClaimedContext)
    _set_step(ctx, step)
    _set_fixed(ctx, None)
    set_fields(ctx, worker_id, control, durable)
    return ctx
