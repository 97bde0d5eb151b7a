"""The ``@step`` decorator: a function whose calls a durable function journals."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from pyclient.context import active
from pyclient.durable._calls import MAX_ID
from pyclient.durable._digest import args_digest
from pyclient.durable._policy import (
    Backoff,
    StepPolicy,
    call_with_policy,
    call_with_policy_async,
    check_room,
    timed,
    timed_async,
)
from pyclient.durable._replay import replay_of
from pyclient.errors import InvalidArgument

P = ParamSpec("P")
R = TypeVar("R")

#: Room left in a step id for the occurrence suffix ("#12345").
_SUFFIX = 7

#: When a safe step call's record must be durable: "window" (before the body's next
#: step call runs its function) or "async" (whenever its batch lands).
Record = Literal["window", "async"]


def check_step_id(step_id: str, what: str = "step id") -> str:
    """``step_id`` when the server accepts it: 1-200 printable characters."""
    if not isinstance(step_id, str) or not 1 <= len(step_id) <= MAX_ID:
        raise InvalidArgument(f"a {what} must be 1-{MAX_ID} characters, got {step_id!r}")
    if not step_id.isprintable():
        raise InvalidArgument(f"a {what} must be printable characters, got {step_id!r}")
    return step_id


class StepFunction(Generic[P, R]):
    """A function decorated with :func:`step`. Called inside a durable function, each
    call is a journaled step call; called anywhere else, it simply runs."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None,
        unsafe_to_repeat: bool,
        policy: StepPolicy | None = None,
        check_args: bool = True,
        digest: Callable[..., Any] | None = None,
        on_args_change: str = "fail",
        record: Record = "window",
    ):
        if record not in ("window", "async"):
            raise InvalidArgument(f'record must be "window" or "async", got {record!r}')
        if digest is not None and not callable(digest):
            raise TypeError(
                f"digest= must be a function of the step's arguments returning JSON, got {digest!r}"
            )
        if on_args_change not in ("fail", "allow"):
            raise InvalidArgument(
                f"on_args_change must be 'fail' or 'allow', got {on_args_change!r}"
            )
        self.fn = fn
        #: "async": the body's next step call does not wait for this call's record.
        self.record: Record = record
        #: The base of the step ids of its calls: ``name``, ``name#2``, ...
        self.name = check_step_id(fn.__name__ if name is None else name, "step name")
        if len(self.name) > MAX_ID - _SUFFIX:
            raise InvalidArgument(f"a step name must be at most {MAX_ID - _SUFFIX} characters")
        #: What the journal records as the function: ``name`` when given, else the
        #: function's qualified name without its module (``charge``,
        #: ``Checkout.charge``), so the same code records the same calls whether its
        #: module runs as ``__main__`` or is imported.
        self.function = (fn.__qualname__ if name is None else name)[-MAX_ID:]
        #: The form journals recorded before (module and qualified name): a replay
        #: of a run in flight that recorded it still matches.
        self.legacy_function = f"{fn.__module__}.{fn.__qualname__}"[-MAX_ID:]
        self.unsafe_to_repeat = unsafe_to_repeat
        self.is_async = inspect.iscoroutinefunction(fn)
        #: Retries, backoff and timeout of its calls inside a durable function.
        self.policy = policy or StepPolicy()
        if self.policy.retries:
            check_room(self.name + "#" * _SUFFIX, self.policy)
        #: Whether its calls record a digest of their arguments, checked on replay.
        self.check_args = check_args
        self.digest = digest
        #: "fail" (a changed argument is a ReplayMismatch) or "allow" (a warning).
        self.on_args_change = on_args_change
        #: What runs one try: the function, or the function under its timeout.
        self.runner: Callable[..., Any] = fn
        if self.policy.timeout is not None:
            wrap = timed_async if self.is_async else timed
            self.runner = wrap(fn, self.policy.timeout)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._call(None, args, kwargs, 0)

    def with_step_id(self, step_id: str) -> Callable[P, R]:
        """This step, called under the step id ``step_id`` instead of the next
        ``name#n``: ``charge.with_step_id(f"charge:{item}")(item)``."""
        check_step_id(step_id)

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return self._call(step_id, args, kwargs, 0)

        return call

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As a method: bound to ``obj``, still journaled."""
        if obj is None:
            return self
        return _BoundStep(self, obj)

    def _call(
        self, step_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any], bound: int
    ) -> R:
        """A call with ``args`` (the first ``bound`` of them the instance of a method,
        left out of the digest)."""
        ctx = active()
        # Outside a durable function, or inside another step call: a plain call.
        replay = replay_of(ctx)
        if replay is None:
            return self.fn(*args, **kwargs)
        assert ctx is not None
        digest = self._digest(args[bound:], kwargs)
        result: Any
        if self.is_async:
            if self.policy.retries and step_id is None:
                step_id = replay.name_call(self)
            if step_id is not None and self.policy.retries:
                check_room(step_id, self.policy)
            first = replay.open(self, step_id, digest)
            if self.policy.retries:
                result = call_with_policy_async(replay, ctx, self, first, args, kwargs, digest)
            else:
                result = replay.call_async(ctx, self, *first, args, kwargs)
        elif self.policy.retries:
            result = call_with_policy(replay, ctx, self, step_id, args, kwargs, digest)
        else:
            result = replay.call(ctx, self, step_id, args, kwargs, digest=digest)
        return result  # type: ignore[no-any-return]

    def _digest(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The digest of a call's arguments, "" when the step does not check them."""
        if not self.check_args:
            return ""
        return args_digest(self.name, self.fn, args, kwargs, self.digest)

    def __repr__(self) -> str:
        mark = ", unsafe_to_repeat=True" if self.unsafe_to_repeat else ""
        mark += ', record="async"' if self.record == "async" else ""
        return f"<step {self.name!r} of {self.function}{mark}>"


class _BoundStep:
    """A step that is a method, bound to its instance."""

    def __init__(self, step: StepFunction[..., Any], obj: Any):
        self._step, self._obj = step, obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._step._call(None, (self._obj, *args), kwargs, 1)

    def with_step_id(self, step_id: str) -> Callable[..., Any]:
        check_step_id(step_id)
        return lambda *args, **kwargs: self._step._call(step_id, (self._obj, *args), kwargs, 1)


@overload
def step(fn: Callable[P, R], /) -> StepFunction[P, R]: ...


@overload
def step(
    *,
    name: str | None = None,
    unsafe_to_repeat: bool = False,
    retries: int = 0,
    backoff: Backoff = 1.0,
    timeout: float | None = None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    check_args: bool = True,
    digest: Callable[..., Any] | None = None,
    on_args_change: str = "fail",
    record: Record = "window",
) -> Callable[[Callable[P, R]], StepFunction[P, R]]: ...


def step(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    unsafe_to_repeat: bool = False,
    retries: int = 0,
    backoff: Backoff = 1.0,
    timeout: float | None = None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    check_args: bool = True,
    digest: Callable[..., Any] | None = None,
    on_args_change: str = "fail",
    record: Record = "window",
) -> StepFunction[P, R] | Callable[[Callable[P, R]], StepFunction[P, R]]:
    """Make ``fn`` a step: inside a durable function each call is journaled under a
    step id (``name``, then ``name#2``, ... in call order; ``name`` defaults to the
    function's) and replayed from the journal when the node runs again.

    ``unsafe_to_repeat=True``: the call is recorded ``started`` before the function
    runs; when a later attempt finds it started with no outcome, the run blocks
    instead of running it again, until an operator resolves it.

    ``record``: a call's record is durable before the body's next step call runs its
    function ("window", the default), so a crash runs again at most the call the body
    was in. ``record="async"`` lets the next call start while the record is on its way
    (more calls per second); a crash may then run again the calls whose records had not
    landed, however far the body went past them.

        @step
        def reserve(order_id): ...

        @step(unsafe_to_repeat=True)
        def charge(order_id, amount): ...

    Policies (inside a durable function): ``retries=N`` more tries after a failure
    (each try journaled: ``charge``, ``charge~2``, ...), ``backoff`` seconds before the
    second try, doubling after (or a function of the failed try's number), slept
    durably; ``retry_on`` the exception classes retried (default: any Exception but
    the SDK's non-retryable ones); ``timeout`` seconds a try may take (StepTimeout;
    for an unsafe step the run blocks instead).

    Arguments: each call records a digest of its arguments (JSON; a dataclass as its
    fields) and a replay whose arguments differ fails with ReplayMismatch.
    ``check_args=False`` records none; ``digest=f`` digests ``f(*args, **kwargs)``
    instead (the JSON that stands for the arguments); ``on_args_change="allow"``
    replays the recorded outcome with a warning. See docs/durable-functions.md.
    """
    policy = StepPolicy.of(retries, backoff, timeout, retry_on)

    def decorate(f: Callable[P, R]) -> StepFunction[P, R]:
        return StepFunction(
            f,
            name=name,
            unsafe_to_repeat=unsafe_to_repeat,
            policy=policy,
            check_args=check_args,
            digest=digest,
            on_args_change=on_args_change,
            record=record,
        )

    return decorate if fn is None else decorate(fn)
